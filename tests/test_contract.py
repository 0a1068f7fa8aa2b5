"""Names and codes that cross layers: the runtime, the supervisor and the cluster's restart policy must agree."""

from trainforge import contract, exits


def test_preempted_is_retryable_and_user_errors_are_not():
    assert exits.is_retryable(exits.EXIT_PREEMPTED)
    assert 128 <= exits.EXIT_PREEMPTED <= 255, "training-operator's ExitCode policy retries only 128-255"
    assert not exits.is_retryable(exits.EXIT_USER_ERROR)
    assert not exits.is_retryable(1), "an uncaught exception is a bug in the job, not a reason to retry"
    assert exits.is_retryable(137) and exits.is_retryable(-9), "a SIGKILLed worker (OOM, node loss) is retried"
    assert not exits.is_retryable(exits.EXIT_OK)


def test_flavour_traits_put_gpu_taints_on_every_gpu_flavour_and_spot_taint_only_on_spot():
    for flavour in contract.GPU_FLAVOURS:
        traits = contract.flavour_traits(flavour)
        assert any(t.key == contract.TAINT_GPU for t in traits.taints)
        assert any(t.key == contract.TAINT_SPOT for t in traits.taints) == (flavour is contract.Flavour.GPU_SPOT)
    assert contract.flavour_traits(contract.Flavour.SYSTEM).taints == ()
