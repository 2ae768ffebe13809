"""What hpcddp sets for Open MPI's failure detector before MPI_Init
(``startup.mpi_init.detect_silent_ranks``): only under ULFM, never over the job's own
settings, off at ``HPCDDP_ELASTIC_DETECT=0`` and below MPI_THREAD_MULTIPLE (the
heartbeat thread needs it), in the progress engine, and a period Open MPI accepts."""

from hpcddp.startup.mpi_init import detect_silent_ranks, detector_needs_progress

ULFM = {"OMPI_MCA_mpi_ft_enable": "true"}


def _set(env):
    env = dict(env)
    detect_silent_ranks(env)
    return {k: v for k, v in env.items() if k.startswith("OMPI_MCA_mpi_ft_detector")}


def test_under_ulfm_the_detector_runs_in_the_progress_engine_with_hpcddp_s_timeout():
    said = _set(dict(ULFM, HPCDDP_ELASTIC_DETECT="4"))
    assert said == {"OMPI_MCA_mpi_ft_detector": "true",
                    "OMPI_MCA_mpi_ft_detector_thread": "false",
                    "OMPI_MCA_mpi_ft_detector_timeout": "4",
                    "OMPI_MCA_mpi_ft_detector_period": "0.8"}
    assert float(said["OMPI_MCA_mpi_ft_detector_timeout"]) > \
        3 * float(said["OMPI_MCA_mpi_ft_detector_period"])  # Open MPI's rule
    assert detector_needs_progress(dict(ULFM, **said))


def test_nothing_is_set_without_ulfm_when_off_below_multiple_or_when_the_job_chose():
    assert _set({}) == {}
    assert _set(dict(ULFM, HPCDDP_ELASTIC_DETECT="0")) == {}
    assert _set(dict(ULFM, MPI4PY_RC_THREAD_LEVEL="serialized")) == {}
    own = {"OMPI_MCA_mpi_ft_detector": "false"}
    assert _set(dict(ULFM, **own)) == own


def test_a_detector_on_its_own_thread_needs_no_heartbeat_thread():
    assert not detector_needs_progress({"OMPI_MCA_mpi_ft_detector": "1",
                                  "OMPI_MCA_mpi_ft_detector_thread": "true"})
    assert not detector_needs_progress({})
