"""A speculative-decoding cost model fitted to the study's own cells: why a setting won, and what steps 4, 5, ... do.

    python -m workflow_scripts.analysis.cost_model --study results/embedded-cpu --predict-steps 4 5

Modules, imported one way (the tables import ``report``, which imports the rest): ``speculation`` (E_k, E'_k,
the renewal count), ``data`` (the measured and external sources in the model's terms), ``fit`` (step shape, fit,
predict, leave-one-out), ``report`` (the whole analysis, its markdown, the predicted best steps) and ``__main__``.

The model (Leviathan et al. 2023, with one α per draft position and a cost that depends on concurrency C), fitted
for each workload w on its own:

- tokens per verify with k drafts: E_k = 1 + Σ_{j=1..k} α_1·…·α_j, where α_j is the chance draft position j is
  accepted once the j−1 before it were (``acceptance.py``); positions past the measured ones reuse the last α;
- one speculative step costs r(k, C) = 1 + o + s_C·u(k, C) plain decode steps at the same concurrency. Without
  more knowledge u = k: each draft position adds a draft forward and one more token per row in the verify, s_C
  plain decode steps, and o is a fixed overhead per step (the draft's catch-up on the tokens the last verify
  committed, the acceptance bookkeeping). Where the engine's own step was profiled
  (``profiling/forward_profile.py``: the embedded engine's seconds per decode forward at each C and k, in-process,
  made non-decreasing in k), u(k, C) is the profiled step cost − 1, which holds the fixed part too (o = 0), and
  s_C scales it to what the server pays in the study's cells. The step's cost is not linear in k: at large C the
  verify's MoE turns compute-bound and its blocking adds a pass past 256 tokens, so a line through the small step
  counts misses the large ones;
- speculation speeds up decode forwards only: where the server reports its forward time by mode (the embedded
  engine's ``specstudy:*_forward_seconds_total``, ``forward_time.py``), a share f of the baseline's forward time
  went to prefill-only forwards, and a speculative setting's prefill costs ρ_w times the baseline's on workload w
  (its draft prefills too, in more and smaller forwards);
- a verify adds E'_k ≤ E_k tokens to the cell (``speculation.committed_per_verify``): a request's last verify
  commits only what its length has left (the drafts past EOS or max_new_tokens are lost), and a finished request's
  slot stays empty for g decode forwards until its successor is prefilled, so a setting that commits more per
  verify finishes more requests per forward and runs fewer rows. E'_k = (L̄ + g) ÷ (V̄_k + g), from the baseline's
  lengths L (tokens after the first) and the verifies V_k(L) they need (a renewal count over α); g is measured
  where the engine counts verifies and decode forwards (rows per forward = C·V̄ ÷ (V̄ + g)), 0 elsewhere. A fit on
  E_k would charge these losses to the step cost, which would then grow too fast in k;
- so tok/s(k, C) = tok/s(baseline, C) ÷ ((1 − f)·r(k, C) ÷ E'_k + f·ρ_w), for aggregate and per-request tok/s
  alike (Amdahl's law; f = 0 without forward times, which is the plain E'_k ÷ r(k, C)).

α comes from the requests' ``spec_correct_drafts_histogram``; f and each setting's ρ from the forward times. ρ_w
is the median ρ of the fitted settings' cells of workload w over every C, not one ρ per cell: one cell's ρ is a
ratio of two short windows' prefill seconds, noisy enough to move a prediction off the workload's own s_C. o and
s_C come from the measured speedups by weighted least squares (r_obs = E'_measured · (1 ÷ speedup − f·ρ_w) ÷
(1 − f), relative residuals) over settings × concurrency. The verify's and the draft's shares of s_C are not
separable from throughput (both grow by one forward per draft); o is fitted only when at least two step counts are
measured and no profile shapes the step, else it is 0.

o, s_C and ρ are a workload's own: the workloads differ in what a step carries (the realistic answers run longer
than the synthetic ones), and the engine's forward times differ with them, so one s_C shared by the workloads
would split the difference and mispredict both.

Validation: leave one setting out, fit α and costs on the others, predict its cells; the 80th percentile of the
absolute errors is the *stated error* printed beside every prediction. A step count that was never measured is
predicted where the fit never looked, from the profile's shape alone, so its stated error also holds the profile's
own uncertainty: the step cost moved over the profile's range between its repeats (s_C × half the range of u),
carried through to tok/s and added in quadrature. The measurements behind these choices are in docs/cost_model.md.
"""
