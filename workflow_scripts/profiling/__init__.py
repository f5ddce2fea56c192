"""In-process profiles of the embedded engine's forwards, apart from `engine/`: editing a profile must not change
the engine's code digest, on which every measured cell is keyed (client/cohorts.py)."""

# forward_profile.py's table: a step's median seconds per (concurrency, steps), and those ÷ the plain decode step's
FORWARD_PROFILE_COLUMNS = ("concurrency", "steps", "seconds", "step_cost")
