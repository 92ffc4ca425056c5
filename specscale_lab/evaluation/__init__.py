"""`specscale eval`: PRM-guided search on a real math data set, graded with math-verify, resumable."""
