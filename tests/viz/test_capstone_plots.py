"""Notebook 08's answers view: the marks it draws are the grounded checks of the answers it shows."""
from inferlab.strategy import questions as Q
from inferlab.viz import capstone_plots as P


def fake_runs():
    answer = {it["name"]: it["answer"] for it in Q.load()["intents"]}
    workload = [{"question": "I forgot my password", "label": "reset_password"},
                {"question": "write me a poem", "label": None}]
    results = {"model": {"grounded": 0.0, "answers": {"r0": "According to our FAQ, ask a friend.", "r1": "No."}},
               "cache": {"grounded": 1.0, "answers": {"r0": answer["reset_password"], "r1": answer["cancel_order"]}}}
    for r in results.values():  # as capstone.serve records them: in-scope requests only
        r["grounded_by_request"] = {"r0": Q.grounded(r["answers"]["r0"], "reset_password")}
    return results, workload


def test_marks_are_each_rows_grounded_check_and_out_of_scope_has_none():
    results, workload = fake_runs()
    fig = P.quality_figure(results, workload, 0)
    assert list(fig.data[0].y) == [0.0, 1.0]                       # the bars: each row's grounded share
    assert list(fig.data[1].x) == ["model", "cache"] and list(fig.data[1].y) == [0.0, 1.0]
    assert fig.data[1].text[1].startswith("Open the sign-in page")  # the hover shows the answer itself
    empty = P.quality_figure(results, workload, 1)
    assert list(empty.data[1].y) == [] and "poem" in empty.layout.title.text


def test_table_shows_every_rows_answer_escaped_with_its_mark():
    results, workload = fake_runs()
    results["model"]["answers"]["r0"] = "<b>bold</b>"
    html = P.answers_table(results, workload, 0)
    assert "&lt;b&gt;bold&lt;/b&gt;" in html and html.count("<tr>") == 3
    assert html.index("<td>no</td>") < html.index("<td>yes</td>")
