"""The serving core both executors share: the plan/result contract, the SimPy serving loop, the
scheduler and its batch builder, requests, workloads and metrics."""
