"""Background work on RQ: job functions, the pass planner, the model provider, the schedule."""
