"""Calibration of the simulator from measurements: CPU cost fits, workload fits from traces."""
