"""moe package."""
