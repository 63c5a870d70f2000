"""The throwaway PostgreSQL installs nothing: without the server's binaries it says how
to get them, before it creates anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from eventspool.spark import pgserver


def test_missing_binaries_name_the_install_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pgserver, "find_bin_dir", lambda: None)
    with pytest.raises(pgserver.PostgresUnavailableError) as raised:
        pgserver.LocalPostgres(tmp_path).start()
    assert "apt-get install postgresql" in str(raised.value)
    assert "make postgres" in str(raised.value)
    assert not any(tmp_path.iterdir())
