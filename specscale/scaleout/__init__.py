"""Scale-out on Ray Serve: `specscale serve --ray --replicas R` (docs/scale-out.md).

Imports Ray only in its own modules, so the base install (no `specscale[ray]`) never needs it.
"""
