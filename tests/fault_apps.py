"""ClientApps for fault tests: the real handlers, with injected failures."""

from __future__ import annotations

from flwr.clientapp import ClientApp


def failing_client_app(fail_pid: int, fail_on_backward: int) -> tuple[ClientApp, dict[int, int]]:
    """The real handlers, except that ``fail_pid`` raises on its ``fail_on_backward``-th ``train.backward``.

    Returns:
        ``(app, counts)``: ``counts[pid]`` is the number of ``train.backward``
        messages node ``pid`` has received so far.
    """
    from fl_app import client_app as real

    wrapper = ClientApp()
    counts: dict[int, int] = {}

    @wrapper.query("info")
    def _info(msg, ctx):
        return real.query_info(msg, ctx)

    @wrapper.train("forward")
    def _forward(msg, ctx):
        return real.train_forward(msg, ctx)

    @wrapper.train("backward")
    def _backward(msg, ctx):
        pid = int(ctx.node_config["partition-id"])
        counts[pid] = counts.get(pid, 0) + 1
        if pid == fail_pid and counts[pid] == fail_on_backward:
            raise RuntimeError("injected failure")
        return real.train_backward(msg, ctx)

    @wrapper.train("step")
    def _step(msg, ctx):
        return real.train_step(msg, ctx)

    @wrapper.evaluate()
    def _evaluate(msg, ctx):
        return real.evaluate(msg, ctx)

    return wrapper, counts
