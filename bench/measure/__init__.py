"""The measurement: timing, memory, FLOPs, the float64 reference, the machine."""
