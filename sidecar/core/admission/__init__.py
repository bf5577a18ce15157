"""Admission: the state machine of the bulkhead, its decisions, compartments and tenants, what a
running stream holds, the modes' pricing and when a refused caller should come back (pure)."""
