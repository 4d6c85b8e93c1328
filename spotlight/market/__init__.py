"""Facts of the spot market that the runtime and the simulator share: traces, prices, pools, billing.

Both replay the same availability traces, price devices from the same table and bill them by the
same rule, so those facts live here, below both: `runtime/` and `sim/` import this package, never
each other.
"""
