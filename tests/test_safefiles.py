"""safefiles: atomic replacement that never follows a planted symlink, durable when asked."""

import os
import stat

from geryon.safefiles import replace_bytes, replace_file


def test_replace_bytes_replaces_a_symlink_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    path = tmp_path / "state"
    path.symlink_to(victim)
    replace_bytes(path, b"\x00new", mode=0o600, durable=True)
    assert victim.read_bytes() == b"keep"
    assert not path.is_symlink() and path.read_bytes() == b"\x00new"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state", "victim"]   # no temporary file left


def test_replace_file_writes_text_with_its_mode(tmp_path):
    path = tmp_path / "record.json"
    replace_file(path, '{"a": 1}\n')
    replace_file(path, '{"a": 2}\n', mode=0o640)
    assert path.read_text() == '{"a": 2}\n'
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
