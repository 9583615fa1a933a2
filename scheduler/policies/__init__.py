"""Built-in policies; importing this package registers them (one module per policy).

* ``opportunistic`` — FCFS on the user's GPU count, fastest GPUs first (the Frenzy paper's
  baseline);
* ``has`` — Frenzy's heterogeneity-aware scheduler (Algorithm 1);
* ``sia`` — Sia's goodput-optimising MILP rounds (SOSP'23 baseline).

The elastic deadline-aware policy will live in its own module here and register itself the
same way.
"""

# elastic, elasticflow: the deadline-aware elastic policies (ours; ElasticFlow's)
from scheduler.policies import elastic, elasticflow, has, opportunistic, sia

__all__ = ["elastic", "elasticflow", "has", "opportunistic", "sia"]
