"""Lay the merged tuned config out where a server looks for it, after checking it is for this device.

Layout: {moe_dir}/configs/{version_dir}/{file_name}, i.e. SGLANG_MOE_CONFIG_DIR={moe_dir}
(SGLang: version_dir = triton_<version>; embedded engine: embedded_v1). installed.json tells the
launcher what to pass and which file the server must report loading.

CLI: python -m workflow_scripts.moe.install --merged merged.json --out DIR/installed.json
     [--moe-dir DIR] [--expect-device NAME]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workflow_scripts.io import atomic_write_json
from workflow_scripts.moe.naming import device_label, parse_config_file_name


class DeviceMismatchError(ValueError):
    """A tuned file for another device; the message names the file and both devices."""


def check_device(file_name: str, device_name: str, where: str) -> None:
    """Refuse a tuned file whose device_name is not `device_name` (SGLang would silently not load it)."""
    tuned_for = parse_config_file_name(file_name)["device_name"]
    if tuned_for != device_label(device_name):
        raise DeviceMismatchError(
            f"{where}: {file_name} was tuned on {tuned_for!r}, but this device is {device_label(device_name)!r}; "
            "a server here would not load it. Rerun the MoE tuning on this device (delete the moe/ results)."
        )


def install(merged: dict, moe_dir: Path, expect_device: str | None, where: str) -> dict:
    """Write the tuned file in place; returns the installed.json record."""
    if expect_device:
        check_device(merged["file_name"], expect_device, where)
    target = moe_dir / "configs" / merged["version_dir"] / merged["file_name"]
    atomic_write_json(target, merged["configs"])
    fields = parse_config_file_name(merged["file_name"])
    return {
        "config_dir": str(moe_dir.resolve()),
        "file": str(target.resolve()),
        "device_name": fields["device_name"],
        "version_dir": merged["version_dir"],
        "E": fields["E"],
        "N": fields["N"],
        "engine": merged["engine"],
        "search": merged["search"],
    }


def this_device(engine: str) -> str | None:
    """The device a server of this engine will run on, when this machine can tell (embedded: the CPU)."""
    if engine == "embedded":
        from workflow_scripts.engine import fused_moe as engine_moe

        return engine_moe.device_name()
    return None


def main(argv: list[str] | None = None) -> None:
    """CLI entry point of the install rule."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--merged", type=Path, required=True)
    parser.add_argument("--moe-dir", type=Path, default=None,
                        help="becomes SGLANG_MOE_CONFIG_DIR (default: the folder of --out)")
    parser.add_argument("--out", type=Path, required=True, help="installed.json")
    parser.add_argument("--expect-device", default=None,
                        help="device the servers run on (default: this CPU for embedded; moe.device.name for sglang)")
    args = parser.parse_args(argv)
    merged = json.loads(args.merged.read_text())
    expect = args.expect_device or this_device(merged["engine"])
    record = install(merged, args.moe_dir or args.out.parent, expect, str(args.merged))
    atomic_write_json(args.out, record)
    print(f"installed {record['file']}")


if __name__ == "__main__":
    main()
