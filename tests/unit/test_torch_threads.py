"""The order that decides a rank's torch threads (``hpcddp.env.torch_threads``)."""

from hpcddp.env.torch_threads import choose_threads


def test_hpcddp_setting_comes_first():
    assert choose_threads(3, {"OMP_NUM_THREADS": "2"}, 5, 8, 1) == (3, "HPCDDP_NUM_THREADS=3")


def test_omp_num_threads_then():
    assert choose_threads(0, {"OMP_NUM_THREADS": " 2 "}, 5, 8, 1) == (2, "OMP_NUM_THREADS=2")


def test_a_count_set_in_the_script_then():
    count, why = choose_threads(0, {}, 5, 8, 1)
    assert (count, why) == (5, "torch.set_num_threads(5) before hpcddp.init()")


def test_the_cores_share_last():
    count, why = choose_threads(0, {"OMP_NUM_THREADS": "many"}, 8, 8, 1)
    assert count == 1 and why.startswith("the cores of this rank's affinity mask")
    assert choose_threads(0, {"OMP_NUM_THREADS": "0"}, 8, None, 2)[0] == 2
