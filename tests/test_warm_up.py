"""fl_app.client.warm_up: a long-lived client process imports the first optimizer's modules in the background,
once, and a deployed node's session answers its first request only after that."""

import subprocess
import sys
import textwrap
import threading
import time

import fl_app.client_app as client_app
from fl_app.client import warm_up


def test_the_warm_up_imports_dynamo_once_in_the_background():
    # A fresh interpreter: this test process may have imported torch._dynamo already.
    code = textwrap.dedent("""
        import sys, threading
        import torch
        from fl_app.client import warm_up
        assert "torch._dynamo" not in sys.modules, "importing torch alone already imports dynamo"
        assert warm_up.start_warm_up() is True
        assert warm_up.start_warm_up() is False
        threads = [t for t in threading.enumerate() if t.name == "sflower-warm-up"]
        assert len(threads) == 1 and threads[0].daemon
        warm_up.wait_warm_up()
        assert not threads[0].is_alive() and "torch._dynamo" in sys.modules
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_session_serves_its_first_request_after_the_warm_up(monkeypatch):
    events = []
    release = threading.Event()

    def slow_warm_up():
        release.wait(10)
        events.append("warmed")

    monkeypatch.setattr(warm_up, "warm_up", slow_warm_up)
    monkeypatch.setattr(warm_up, "_thread", None)
    monkeypatch.setattr(client_app, "app", lambda msg, context: events.append(("app", msg)) or "reply")
    handles = []
    monkeypatch.setattr(client_app, "serve_session", lambda msg, context, handle: handles.append(handle) or msg)

    msg, context = object(), object()  # passed through untouched
    assert client_app.session(msg, context) is msg
    assert warm_up._thread is not None and warm_up._thread.is_alive()  # started when the session opened
    answered = threading.Thread(target=lambda: events.append(handles[0]("request", context)))
    answered.start()
    time.sleep(0.2)
    assert events == []  # the request waits for the warm-up
    release.set()
    answered.join(10)
    assert events == ["warmed", ("app", "request"), "reply"]
