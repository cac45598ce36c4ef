"""workspace sync: a file the student deleted to start over comes back without a stale
NAME.upstream.EXT beside it, and the report counts files in good English."""
from __future__ import annotations

from inferlab.viz import workspace as ws


def course(tmp_path, text="x = 1\n"):
    src = tmp_path / "course"
    for folder in ws.FOLDERS:
        (src / folder).mkdir(parents=True, exist_ok=True)
    (src / "labs" / "starter.py").write_text(text)
    return src


def test_deleting_an_edited_file_starts_it_over_without_a_stale_upstream(tmp_path):
    src = course(tmp_path)
    dest = tmp_path / "ws"
    assert ws.sync(src, dest).lines() == ["workspace: copied 1 course file"]
    (dest / "labs" / "starter.py").write_text("x = 'mine'\n")  # the student edits ...
    (src / "labs" / "starter.py").write_text("x = 2\n")        # ... the course changes too
    report = ws.sync(src, dest)
    assert report.kept == ["labs/starter.py"] and (dest / "labs" / "starter.upstream.py").exists()
    (dest / "labs" / "starter.py").unlink()                    # start over
    report = ws.sync(src, dest)
    assert report.created == ["labs/starter.py"]
    assert (dest / "labs" / "starter.py").read_text() == "x = 2\n"
    assert sorted(p.name for p in (dest / "labs").iterdir()) == ["starter.py"]
    (src / "labs" / "other.py").write_text("y = 1\n")
    (dest / "labs" / "starter.py").unlink()
    assert ws.sync(src, dest).lines() == ["workspace: copied 2 course files"]
