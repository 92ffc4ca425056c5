"""The lab that measures the serving system: benchmarks, evaluation, the toy task and training, calibration
of the simulator. It uses `specscale` only through its public surface; `specscale` never imports it."""
