"""The tests of torch's suite that gloo passes and hpcddp does not, each with the reason.

None is a wrong result: torch refuses the call for any backend but gloo, or the test
compares the backend's name with the suite's ``BACKEND`` (gloo, as the suite is gated).
"""

_GLOO_ONLY = ("torch's monitored_barrier is implemented for gloo alone "
              "(\"monitored_barrier is only implemented for GLOO backend\")")

KNOWN = {
    "test_get_backend": "compares dist.get_backend() with the suite's BACKEND: 'hpcddp' "
                        "is not 'gloo'",
    "test_monitored_barrier_gloo": _GLOO_ONLY,
    "test_monitored_barrier_gloo_subgroup": _GLOO_ONLY,
    "test_monitored_barrier_gloo_rank_0_timeout": _GLOO_ONLY + "; its group has no gloo "
                                                  "backend for the CPU",
    # At 8 ranks only (skip_if_small_worldsize): rank 0 is refused by torch, the others
    # then wait in the suite's barrier for a rank 0 that has left the test.
    "test_monitored_barrier_failure_order": _GLOO_ONLY,
    "test_monitored_barrier_wait_all_ranks": _GLOO_ONLY,
}
