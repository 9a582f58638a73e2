"""The fleet: N replicas of the serving loop behind a router, in one SimPy environment (docs/fleet.md)."""
