"""Test set-up, decided before numba is imported.

* Where no GPU is usable, run on the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``); an
  explicit ``NUMBA_ENABLE_CUDASIM`` from the user always wins.  The probe asks the CUDA
  driver directly (ctypes), so numba is not imported before the choice is made.
* Hypothesis profiles: ``sim`` (few, small examples: ~400 simulated threads/s),
  ``gpu`` (many, larger examples) and ``fuzz`` (the long reliability run).  The right one
  of the first two is loaded by default; ``--hypothesis-profile NAME`` overrides it.
  ``deadline=None`` everywhere: the first example of a kernel pays its JIT compilation.
* Two tiers.  ``pytest`` runs the quick tier: every test but the slow ones that
  :data:`FULL_ONLY`, :data:`QUICK_CASES` and :data:`QUICK_WITHOUT` name (the slow cases
  of a test whose cheapest case stays, a few slow runs of tools); ``pytest --full`` (or
  ``NUMBA_SOFTMAX_FULL=1``) runs everything — what CI runs.  A test named on the command
  line (``file::test``) always runs.  On a GPU both tiers run at GPU sizes, and the quick
  tier leaves out only :data:`FULL_ONLY`: the cases QUICK_CASES and QUICK_WITHOUT name are
  the simulator's (a GPU's cases of those tests have other sizes, other ids), so on a GPU
  the quick tier runs every case of those tests.
"""

import ctypes
import os


def _gpu_usable():
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        return libcuda.cuInit(0) == 0 and libcuda.cuDeviceGetCount(ctypes.byref(count)) == 0 \
            and count.value > 0
    except OSError:
        return False


if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _gpu_usable():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("sim", max_examples=8, **_common)
# the GPU check's suite job lowers it (NUMBA_SOFTMAX_GPU_EXAMPLES): its fuzz shards draw the many
settings.register_profile("gpu", max_examples=int(os.environ.get("NUMBA_SOFTMAX_GPU_EXAMPLES", 150)),
                          **_common)
# the GPU check runs the fuzz tests in shards of NUMBA_SOFTMAX_FUZZ_EXAMPLES cases per test
settings.register_profile("fuzz", max_examples=int(os.environ.get("NUMBA_SOFTMAX_FUZZ_EXAMPLES", 2000)),
                          **_common)
settings.load_profile("sim" if SIMULATOR else "gpu")


# A GPU runs a grid's blocks in no promised order; the simulator runs them one after
# another, first to last, so a kernel whose last block to finish does the merge (decode's
# splits, the radix top-k's pieces) would always see them finish in index order.  Here
# the simulator takes them in a shuffled order, seeded (NUMBA_SOFTMAX_SIM_BLOCKS: a seed,
# "reverse", or "in order" for the simulator's own).
BLOCK_ORDER = os.environ.get("NUMBA_SOFTMAX_SIM_BLOCKS", "0")


def _shuffle_blocks():
    import random

    import numpy
    from numba.cuda.simulator import kernel

    if BLOCK_ORDER == "in order":
        return
    rng = random.Random(None if BLOCK_ORDER == "reverse" else int(BLOCK_ORDER))

    class _Numpy:  # the simulator's kernel module's numpy, but for the grid's loop
        def __getattr__(self, name):
            return getattr(numpy, name)

        @staticmethod
        def ndindex(*shape):  # (the grid loop is its one caller there: blocks run elsewhere)
            points = list(numpy.ndindex(*shape))
            if BLOCK_ORDER == "reverse":
                points.reverse()
            else:
                rng.shuffle(points)
            return iter(points)

    kernel.np = _Numpy()


# On a GPU, NUMBA_SOFTMAX_TEST_AS=a100 or =ada runs the tests with the launch limits of an
# older GPU (its shared memory a block, its compute capability; the multiprocessors as
# few): the kernels then take the tiles and instructions they would take there — a
# Hopper standing in for GPUs the project has no access to (docs/caveats.md).
EMULATED = {  # (name, multiprocessors, shared memory a block (opt-in), a multiprocessor, L2, cc)
    "a100": ("A100 limits (emulated)", 108, 163 * 1024, 164 * 1024, 40 << 20, (8, 0)),
    "ada": ("RTX 4090 limits (emulated)", 128, 99 * 1024, 100 * 1024, 72 << 20, (8, 9)),
}
TEST_AS = os.environ.get("NUMBA_SOFTMAX_TEST_AS", "")


def _emulate(which):
    from numba_softmax.runtime import launcher

    name, sms, optin, per_sm, l2, cc = EMULATED[which]
    real = launcher.device_limits()
    if sms > real.sms or optin > real.shared_optin:
        raise pytest.UsageError(f"NUMBA_SOFTMAX_TEST_AS={which}: this GPU ({real.name}) is smaller")
    fake = real._replace(name=name, sms=sms, shared_optin=optin, shared_per_sm=per_sm,
                         l2_bytes=l2, cc=cc)
    launcher.device_limits = lambda: fake


def pytest_configure(config):
    if SIMULATOR:
        _shuffle_blocks()
    if TEST_AS:
        if SIMULATOR or TEST_AS not in EMULATED:
            raise pytest.UsageError(f"NUMBA_SOFTMAX_TEST_AS={TEST_AS!r}: one of {sorted(EMULATED)}, "
                                    f"on a GPU")
        _emulate(TEST_AS)


def pytest_report_header(config):
    order = BLOCK_ORDER if BLOCK_ORDER in ("in order", "reverse") else f"shuffled, seed {BLOCK_ORDER}"
    where = f"the CUDA simulator (blocks {order})" if SIMULATOR else "the GPU"
    return [f"numba_softmax tests on {where}" + (f", as {EMULATED[TEST_AS][0]}" if TEST_AS else ""),
            TIERS["full" if _full(config) else "quick"]]


# --- the two tiers ---------------------------------------------------------------------------
TIERS = {
    "quick": "tier: quick (pytest --full for every test, as CI runs them)",
    "full": "tier: full (every test)",
}
# What the quick tier leaves to --full, chosen by time: each test's seconds on the simulator,
# one process on two busy cores (pytest -n 0 --full --durations=0, file by file).  Left out:
# the cases of a second or more of a parametrised test whose cheapest case stays (so every
# kernel and path still runs, at its smallest), and whole tests of five seconds or more that
# run a tool (the docs build, the sanitizer wrapper, the ablation variants, the CLI, the
# examples: the functions they call have their own quick tests) or check a property that
# another quick test checks too.  A test added later is in both tiers until named here;
# tests/test_tiers.py fails on a name here that no longer exists.
FULL_ONLY = [
    "test_attention.py::test_leading_dims_and_strided_inputs",  # views: test_arrays, reliability
    "test_attention.py::test_split_kv_rows_that_see_no_key_give_zero_not_nan",  # check()'s rule
    "test_attention.py::test_tour_runs",
    "test_attention_backward_tc.py::test_fuzz",
    "test_attention_mods.py::test_property",  # the options: the kernel and API tests
    "test_bench.py::test_crossovers_measure_fit_and_save_nothing_on_the_simulator",
    "test_bench.py::test_sim_smoke_end_to_end",
    "test_bench_textbook.py::test_every_rung_beside_its_fast_kernel",
    "test_cli.py::test_an_example_without_sim_falls_back_when_there_is_no_gpu",
    "test_cli.py::test_tour_runs_and_the_online_state_matches_the_naive_one",
    "test_decode_tc.py::test_paged_decode_many_tiles_a_warp",
    "test_docs.py::test_docs_build_without_warnings",
    "test_examples.py::test_01_overflow",
    "test_fuzz.py::test_fuzz_attention",  # the fuzz belongs to the GPU's long runs
    "test_examples.py::test_02_block_sweep",
    "test_examples.py::test_03_memory_traffic",
    "test_examples.py::test_05_flash_attention",
    "test_examples.py::test_06_split_kv_decode",
    "test_examples.py::test_09_decoder_step",
    "test_examples.py::test_10_ring_attention",
    "test_examples.py::test_11_paged_decoder",
    "test_examples.py::test_12_which_kernel",
    "test_examples.py::test_13_serve",
    "test_gpu_check.py::test_simulator_only_modules_are_found_from_their_imports",
    "test_hopper_attention.py::test_negative_scale_float32_output_and_rows_read_value_by_value",
    "test_hopper_attention.py::test_v_read_n_major",
    "test_hopper_backward.py::test_hb2_matches_the_reference",
    # the mutation audit's tests: each the full tier's (their paths have quick tests)
    "test_mutants.py::test_sample_rows_without_softmax_give_minus_one",
    "test_mutants.py::test_top_p_ties_are_cut_at_mass_at_least_p",
    "test_mutants.py::test_topk_merge_folds_more_pieces_than_threads",
    "test_reliability.py::test_sanitize_workload_runs_on_the_simulator",
    "test_reliability.py::test_sanitize_wrapper_builds_its_table",
    "test_sample.py::test_frequencies_fit_the_exact_distribution",
    "test_softmax.py::test_result_independent_of_launch_configuration",
    "test_sources_notes.py::test_combiner_ptx_has_the_asymmetric_fma_and_flushes_denormals",
    "test_textbook.py::test_split_gives_the_reference_for_any_piece_count",
    "test_topk_filter.py::test_choose_leaves_the_filter_to_plans_that_ask",
    "test_tiers.py::test_the_quick_tier_lists_name_collected_tests",
    "test_topk.py::test_lagging_reference_its_rescale_and_special_chunks",
    "test_topk_ablate.py::test_every_variant_builds_and_the_exact_and_close_ones_match_the_package",
]
# of these parametrised tests the quick tier runs only the cases named (the cheapest)
QUICK_CASES = {
    "test_arrays.py::test_numba_views_copy_or_fold_on_the_device": ["permuted", "stepped"],
    "test_attention.py::test_num_splits_in_the_public_api": ["dtype1"],
    "test_attention_mods.py::test_attention_api": ["None"],
    "test_attention_tc.py::test_split_kv_partials_merge": ["bf16"],
    "test_attention_tc.py::test_varlen_never_reads_past_a_sequence": ["bf16"],
    "test_backward.py::test_attention_half_precision_storage": ["dtype0"],
    "test_backward.py::test_wide_cluster_form": ["log_softmax-dtype3"],
    "test_decode_tc.py::test_many_splits_of_sixteen_rows": ["tensor"],
    "test_decode_tc.py::test_more_splits_than_lanes": ["tensor"],
    "test_decode_tc.py::test_paged_decode": ["tensor"],
    "test_decode_tc.py::test_paged_decode_in_chunks": ["pages"],
    "test_fuzz.py::test_fuzz_softmax_topk": ["numba"],
    "test_hopper_attention.py::test_matches_the_reference": ["b1-h1-1-sq8-sk20-d64-64-causal-f16"],
    "test_hopper_attention.py::test_warp_specialized": ["h2-b1-h1-1-sq8-sk40-d64-64-f16"],
    "test_hopper_backward.py::test_matches_the_reference": ["b1-h1-1-sq9-sk20-d64-64-causal-fp16"],
    "test_hopper_backward.py::test_hb2_fused_matches_the_reference":
        ["b1-h3-1-sq9-sk20-d64-64-causal-fp16"],
    "test_reliability.py::test_attention_failed_allocation_surfaces": ["1"],
    "test_reliability.py::test_attention_inputs_never_modified": ["numpy"],
    "test_reliability.py::test_attention_out_is_q": ["numba"],
    "test_reliability.py::test_failed_allocation_surfaces": ["numpy-MemoryError"],
    "test_reliability.py::test_inputs_never_modified": ["reversed"],
    "test_reliability.py::test_repeat_calls_keep_earlier_results_and_see_new_data": ["auto-numba"],
    "test_ring.py::test_virtual_ring_device": ["3-True-13-None-dtype0"],
    "test_sample.py::test_kernel_draws_what_the_numpy_twin_draws": ["gumbel-warp-rows"],
    "test_sample.py::test_strided_float16_rows": ["warp-rows"],
    "test_softmax.py::test_any_axis_and_non_contiguous": ["-1"],
    "test_softmax.py::test_special_values_follow_torch": ["auto"],
    "test_softmax_kernels.py::test_cluster_parks_16_bit_rows_in_pairs": ["bfloat16-logsumexp"],
    "test_softmax_kernels.py::test_cluster_pieces_in_registers":
        ["float32-log_softmax", "float64-log_softmax", "float64-logsumexp"],
    "test_topk.py::test_16_bit_rows_of_several_chunks": ["lists-split-3-bfloat16"],
    "test_topk.py::test_block_per_row_shared_floor": ["False"],
    "test_topk.py::test_radix_merge_by_bound_and_by_radix": ["None-None-True"],
    "test_topk.py::test_radix_split_dtypes_log_temperature": ["bfloat16"],
    "test_topk.py::test_radix_split_special_rows_and_ties": ["19-64-1-False"],
    "test_topk.py::test_split_row_pieces_merged": ["last_piece"],
    "test_topk_filter.py::test_filter_adversarial_orders": ["1"],
    "test_topk_filter.py::test_filter_dtypes_log_temperature": ["float16"],
    "test_topk_filter.py::test_filter_special_rows_and_ties": ["1-32-1"],
}
# and of these it leaves out the cases named
QUICK_WITHOUT = {
    "test_attention.py::test_a_weightless_key_spreads_the_nan_of_its_value_however_the_keys_are_split":
        ["dtype0-40", "dtype1-40"],
    "test_hopper_primitives.py::test_wgmma_from_shared_memory": ["64-f16-4-True", "128-bf16-2-True"],
    "test_attention.py::test_attention_matches_reference": ["dtype0-False-128"],
    "test_attention_backward_tc.py::test_matches_the_reference": ["4-bf16", "4-fp16"],
    "test_attention_features.py::test_decode_grouped_heads_windows_and_splits":
        ["4-2-3-True-window1-3"],
    "test_decode_tc.py::test_decode_matches_reference":
        ["4-1-3-sk1-8-24-True-window1-split1-dtype1-cuda_cores"],
    "test_reliability.py::test_in_place": ["split-numba", "split-numpy"],
    "test_softmax.py::test_every_method_dtype_and_shape":
        ["2-float16-split-softmax", "2-float16-three_pass-log_softmax", "2-float32-online-softmax",
         "2-float32-split-log_softmax", "2-float32-split-logsumexp", "2-float32-split-softmax",
         "2-float64-split-softmax", "2-float64-three_pass-softmax"],
    "test_softmax.py::test_input_never_modified": ["split"],
    "test_softmax_kernels.py::test_every_method_dtype_and_mode":
        ["cluster-bfloat16-log_softmax", "cluster-bfloat16-softmax", "cluster-float16-log_softmax",
         "cluster-float16-logsumexp", "cluster-float16-softmax", "cluster-float32-log_softmax",
         "cluster-float64-softmax"],
    "test_softmax_kernels.py::test_fused_holds_16_bit_rows_in_pairs":
        ["64-1008-bfloat16-log_softmax", "64-1008-bfloat16-softmax", "64-1008-float16-log_softmax",
         "64-1008-float16-logsumexp", "64-1008-float16-softmax"],
    "test_softmax_kernels.py::test_special_values_across_boundaries_in_strided_views":
        ["cluster-float32", "group-float32", "split-float32"],
}


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true", default=False,
                     help="numba_softmax: the full tier — every test (default: the quick tier; "
                          "tests/conftest.py's FULL_ONLY lists what it leaves out)")


def _full(config):
    return config.getoption("--full") or os.environ.get("NUMBA_SOFTMAX_FULL", "") not in ("", "0")


def _left_to_full(nodeid):
    """Whether the quick tier leaves the test ``nodeid`` (``tests/file::test[params]``) out."""
    test, _, params = nodeid.partition("[")
    test, params = test.split("/")[-1], params[:-1]
    if test in FULL_ONLY:
        return True
    if not SIMULATOR:  # the cases named below are the simulator's sizes
        return False
    if test in QUICK_CASES:
        return params not in QUICK_CASES[test]
    return params in QUICK_WITHOUT.get(test, ())


def pytest_collection_modifyitems(config, items):
    if _full(config) or any("::" in a for a in config.args):
        return  # the full tier, or tests named one by one
    left = [item for item in items if _left_to_full(item.nodeid)]
    if left:
        config.hook.pytest_deselected(items=left)
        gone = set(map(id, left))
        items[:] = [item for item in items if id(item) not in gone]


@pytest.fixture
def four_warp_blocks(monkeypatch):
    """Blocks of up to 128 threads on the simulator, whose launch limit is 64 (two warps):
    for a path only blocks of more than two warps take (the top-k lists' shared floor).
    Nothing changes on a GPU.  Returns ``allow(launcher)``, the same for another copy of
    the package's launcher module (``scripts/experiments/topk_ablate.py``'s variants)."""

    def allow(launcher):
        if SIMULATOR:
            monkeypatch.setattr(launcher, "max_threads", lambda kernel, args: 4 * 32)

    from numba_softmax.runtime import launcher

    allow(launcher)
    return allow
