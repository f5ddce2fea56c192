"""In-process profiles of the embedded engine's forwards, apart from `engine/`: editing a profile must not change
the engine's code digest, on which every measured cell is keyed (client/cohorts.py)."""

# forward_profile.py's table: a step's median seconds per (concurrency, steps), those ÷ the plain decode step's, and
# the lowest and highest of that ratio over the repeats (an order-statistic CI of the median: 1 − 2^(1−repeats))
FORWARD_PROFILE_COLUMNS = ("concurrency", "steps", "seconds", "step_cost", "step_cost_low", "step_cost_high")
