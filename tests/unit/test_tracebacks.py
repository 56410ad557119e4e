"""The tests' traceback finder: Ray's random worker-teardown trace is not a failure; every other traceback is."""

from __future__ import annotations

from tests.tracebacks import tracebacks

# As CI printed it (stage exit 0): Tune's clean-up stopped the finished trial's actor during a weakref callback.
WORKER = "\x1b[36m(train_trial pid=2602)\x1b[0m "
RAY_TEARDOWN = "\n".join(
    [
        "Number of trials: 1/1 (1 TERMINATED)",
        *(
            WORKER + line
            for line in [
                "Exception ignored in: <function WeakSet.__init__.<locals>._remove at 0x7efde4c9e980>",
                "Traceback (most recent call last):",
                '  File "/usr/lib/python3.11/_weakrefset.py", line 39, in _remove',
                "    def _remove(item, selfref=ref(self)):",
                "",
                '  File "/venv/lib/python3.11/site-packages/ray/_private/worker.py", line 1063, in sigterm_handler',
                "    raise_sys_exit_with_custom_error_message(",
                '  File "python/ray/_raylet.pyx", line 712, in ray._raylet.raise_sys_exit_with_custom_error_message',
                "SystemExit: 1",
            ]
        ),
        "2026-11-28 19:41:33,123\tINFO tune.py:1039 -- Total run time: 22.03 seconds.",
        "",
    ]
)

# A trial's own failure, its lines interleaved with another worker's and the driver's.
TRIAL_FAILURE = """\
(train_trial pid=7) Traceback (most recent call last):
(train_trial pid=7)   File "/repo/pipeline/trial/loop.py", line 80, in run
19:41:30 INFO stages.tune: waiting
(train_trial pid=8) epoch 3
(train_trial pid=7)     loss.backward()
(train_trial pid=7) RuntimeError: CUDA error
"""


def test_rays_teardown_of_an_idle_worker_is_not_a_failure() -> None:
    assert tracebacks(RAY_TEARDOWN) == []


def test_a_workers_traceback_is_found_whole_among_other_lines() -> None:
    assert tracebacks(TRIAL_FAILURE) == [
        'Traceback (most recent call last):\n  File "/repo/pipeline/trial/loop.py", line 80, in run\n'
        "    loss.backward()\nRuntimeError: CUDA error"
    ]


def test_a_drivers_traceback_is_found_and_a_sigterm_ended_one_of_ours_too() -> None:
    """The driver's own trace, and one that ends in ``SystemExit`` through our code rather than Ray's handler."""
    driver = 'Traceback (most recent call last):\n  File "stages/tune.py", line 9, in main\nKeyError: "x"\n'
    ours = 'Traceback (most recent call last):\n  File "stages/_cli.py", line 70, in _terminate\nSystemExit: 1\n'
    assert [t.splitlines()[-1] for t in tracebacks(RAY_TEARDOWN + driver + ours)] == ['KeyError: "x"', "SystemExit: 1"]
