"""In-process profiles of the embedded engine's forwards, apart from `engine/`: editing a profile must not change
the engine's code digest, on which every measured cell is keyed (client/cohorts.py)."""

# forward_profile.py's table: a step's median seconds per (concurrency, steps), those ÷ the plain decode step's, and
# an order-statistic interval of that ratio's median over the repeats (forward_profile.median_interval)
FORWARD_PROFILE_COLUMNS = ("concurrency", "steps", "seconds", "step_cost", "step_cost_low", "step_cost_high")
