"""Built-in policies; importing this package registers them (one module per policy).

* ``opportunistic`` — FCFS on the user's GPU count, fastest GPUs first (the Frenzy paper's
  baseline);
* ``has`` — Frenzy's heterogeneity-aware scheduler (Algorithm 1);
* ``sia`` — Sia's goodput-optimising MILP rounds (SOSP'23 baseline);
* ``elastic`` — Frenzy's deadline-aware elastic policy, and ``elasticflow`` — ElasticFlow
  (ASPLOS'23), its baseline: two compositions of the deadline engine's strategies
  (``scheduler.policies.deadline``).
"""

from scheduler.policies import elastic, elasticflow, has, opportunistic, sia

__all__ = ["elastic", "elasticflow", "has", "opportunistic", "sia"]
