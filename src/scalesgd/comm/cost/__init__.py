"""The cost model of an iteration: DLGS's timing recurrence, the planners that group layers under it, and the
measurements it is fitted to (per-layer compute, link α and β, codec costs)."""
