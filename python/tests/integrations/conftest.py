"""The harness integrations' fixtures: the run's drumsd has its LLM proxy on,
on a free loopback port, in front of a mock upstream of this process.

The harnesses are quiet and offline here: litellm reads its bundled model
cost map (it must not fetch one), mini-swe-agent keeps its global config in
a directory of this run and prints no banner. These are set before any test
module imports a harness.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator

import pytest

from tests.conftest import require_daemon, serve
from tests.daemon import Daemon, pick_k
from tests.integrations.mock_llm import MockLLM

_MSWEA_DIR = tempfile.mkdtemp(prefix="drums-mswea-")
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
os.environ["MSWEA_SILENT_STARTUP"] = "1"
os.environ["MSWEA_GLOBAL_CONFIG_DIR"] = _MSWEA_DIR
os.environ["MSWEA_COST_TRACKING"] = "ignore_errors"
# A model call broken by a test is retried by mini-swe-agent after 4 s at
# least; a handful of tries is plenty against a local mock.
os.environ["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"] = "3"


def pytest_configure(config: pytest.Config) -> None:
    # The SDK's tests turn every warning into an error. litellm's types warn
    # through pydantic when first built (third-party, not ours to mend).
    config.addinivalue_line(
        "filterwarnings", "ignore:Items? .* using the `ReadOnly` qualifier:UserWarning"
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_MSWEA_DIR, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def mock_llm() -> Iterator[MockLLM]:
    m = MockLLM().start()
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture(scope="session")
def llm_proxy_port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def daemon(mock_llm: MockLLM, llm_proxy_port: int) -> Iterator[Daemon]:
    """The run's drumsd, with `--llm-upstream openai=` the mock and its LLM
    proxy for the host on 127.0.0.1:`llm_proxy_port`; the default client
    (an environment made with no arguments) finds it through DRUMS_SOCKET."""
    require_daemon()
    d = Daemon(
        pick_k(),
        llm_proxy_local=f"127.0.0.1:{llm_proxy_port}",
        extra_args=("--llm-upstream", f"openai=http://127.0.0.1:{mock_llm.port}"),
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DRUMS_SOCKET", str(d.socket))
        mp.setenv("DRUMS_NO_AUTOSTART", "1")
        yield from serve(d)


@pytest.fixture
def llm_proxy(llm_proxy_port: int) -> str:
    """The LLM proxy's base for agents on the host."""
    return f"http://127.0.0.1:{llm_proxy_port}"
