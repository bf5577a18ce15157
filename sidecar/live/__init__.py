"""Live capacity: GPU and engine probes, and the control loop that keeps the plan current."""
