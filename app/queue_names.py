"""The names of Loom's RQ queues, below every layer: the jobs consume them, and a store that
enqueues work or finds jobs (the erasure saga) names them without importing the jobs."""

# Passes plan and fan out; builds call the model. Separate queues let an operator scale the
# workers that call the model without starving the planner.
PASSES = "loom-passes"
BUILDS = "loom-builds"
MAINTENANCE = "loom-maintenance"
ALL_QUEUES = (PASSES, BUILDS, MAINTENANCE)
