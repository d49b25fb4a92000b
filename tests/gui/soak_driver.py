"""Minutes of real use of the window, in its own process: ``python -m tests.gui.soak_driver OUT.json``.

The window runs on the embedded model (CPU) with the demo adapters in a fresh library and, with
``--second-base FOLDER --second-adapter FOLDER``, a second base model (Settings' models list) with
an adapter of its own in the library; with ``--second-base-hub REPO`` that base is served from the
Hub repository REPO holding the same files (HF_ENDPOINT: the test's loopback Hub), and with
``--pull REPO`` (one per base, in order) the Library page pulls each base's adapter from the Hub
in turn (``PullActions``). For
``--seconds``, and on until it has run a compare for each restart (each start serves one
before the next restart: a busy machine makes them slower; the test bounds the whole run), it
visits every view in turn, keeps a compare of base
and every adapter running, lets the Monitor plot, switches the theme, and applies a restart in
Settings ``--restarts`` times (alternating the number of GPU slots; every second restart
starts two engine replicas behind the dispatcher, the next one engine again; with a second base,
the third restart leaves room for one base only, so compares of both bases swap them (the next
restart waits for a swap); every other
restart gives the second base its own GPU slots in the models list, checked after the start; the
second restart turns prefix caching off and the next one on again, checked after each start). A
compare ticks every listed column, the base picker cycling through all bases and each one; every
other compare is a chat action (``start_chat_compare``: follow-ups, a column with its own settings, token
divergence), every fourth an adapter's strength sweep; on the Evaluate page it keeps an
evaluation of base and every adapter going, on each base in turn, cancelling every other one
(``EvaluateActions``); on the Library page it merges an adapter into its base and exports it,
each base in turn, cancelling every other merge (``MergeActions``), and cycles the base filter
(``BaseFilterActions``); on the Arena page it keeps an arena of the first base going, voting on
each round and letting the base judge every third (``ArenaActions``); a training run writes
checkpoints into a folder on its own thread throughout, with rotation (``RunWriter``), and the
Runs view follows it from the first start, resumed after each restart (``RunsActions``). The endpoint
runs throughout (restarted with each engine), a client thread sending it a short completion
every second, for an adapter of each base in turn (``EndpointTraffic``), and the Monitor's usage
table must show what it was sent; the Monitor's base panels and its prefix cache line (off, on,
with hits) are watched (``watch_bases``), and each follow-up's columns must show their prompt's
cached tokens.
It writes what it measured as JSON: references to None over the run, resident memory after
each restart, live Engine objects and engine threads at the end, and every problem seen. The
test that runs it checks those numbers and that the process exited 0 with no fatal error; a
binding that loses references aborts it before that.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.pop("MULTILORA_STUDIO_NO_DEMO_ADAPTERS", None)  # a new user's library: the demo adapters

import psutil
from PySide6.QtCore import QObject, QSettings, QTimer

from multilora_studio.adapters.registry import Registry
from multilora_studio.adapters.run_folder import TRAINER_STATE
from multilora_studio.arena import VERDICTS
from multilora_studio.cli.shared import describe_base
from multilora_studio.demo import demo_adapter_dirs
from multilora_studio.deploy import ReplicaSet, replicas_of
from multilora_studio.engine.residency.host_memory import return_freed_memory
from multilora_studio.gui.app import checked_application
from multilora_studio.gui.compare_column import MARKDOWN, TOKENS
from multilora_studio.gui.main_window import PAGES, MainWindow
from multilora_studio.gui.preferences import HUB_PREFIX, EngineChoice, Preferences
from multilora_studio.gui.theme import set_theme
from multilora_studio.gui.workflows.library_selection import base_key
from multilora_studio.run_records import BASE, ColumnOverrides
from tests.live_objects import live_engines

TICK_MS = 250
PAGE_S = 2.0
COMPARE_TOKENS = 12
EVALUATE_TOKENS = 6
EVALUATE_ROWS = [
    {"prompt": "Name a colour.", "reference": " Blue", "check": "contains"},
    {"prompt": "Is water wet?", "reference": " yes", "check": {"type": "choice", "choices": [" yes", " no"]}},
    {"prompt": "Reply in JSON:", "check": {"type": "json_schema", "schema": {"type": "object"}}},
]
CHAT_TOKENS = 6
ARENA_TOKENS = 6
SECOND_ADAPTER = "soak-second-base"  # the second base's adapter in the library
SWAP_RESTART = 2  # restarts done before the one that leaves room for one base (one engine each)
OWN_SLOTS = 4  # the second base's own GPU slots at every other restart (the Engine's: 2 or 3)
PREFIX_CACHE_OFF_RESTART = 1  # restarts done before the one that turns prefix caching off
# past --seconds by this much the run is stuck: it ends with what it waits for and every thread's
# stack as a problem (normal runs end within 60 s of --seconds); a window thread that stops
# ticking is dumped by faulthandler a minute later
STUCK_AFTER_S = 240.0
RUN_NAME = "soak-run"
RUN_SAVE_S = 12.0  # seconds between the run's checkpoints
RUN_KEPT = 3  # save_total_limit: older checkpoints are deleted


def project_frames(frame) -> list[str]:
    """A thread's stack as the lines of its frames in this project's files, innermost last (its
    innermost frame too, wherever it is: what it waits in)."""
    stack = traceback.extract_stack(frame)
    own = [f for f in stack[:-1] if "/multilora_studio/" in f.filename or "/tests/" in f.filename]
    return traceback.format_list([*own[-6:], stack[-1]])


def base_in_turn(window: MainWindow, started: int) -> str | None:
    """The base an action works on: each base for two actions in turn (a run and a cancelled one)."""
    pool = window.host.pool
    return pool.names[(started // 2) % len(pool.names)] if pool is not None else None


class EvaluateActions:
    """The soak's Evaluate actions: while the Evaluate page shows, a run of base and every adapter
    of a base (one not evaluated yet, else each base in turn, ``base_in_turn``) is kept going over
    a small prompt set, and every second run is cancelled as soon as it starts (a restart cancels
    one too). Errors (not cancellations) are problems; the bases evaluated are counted."""

    def __init__(self, window: MainWindow, folder: Path) -> None:
        self.window = window
        self.prompts = folder / "soak-prompts.jsonl"
        self.prompts.write_text("".join(json.dumps(row) + "\n" for row in EVALUATE_ROWS))
        self.started = self.finished = 0
        self.bases: set[str] = set()  # bases an evaluation finished on
        self.problems: list[str] = []
        window.evaluate.results_dir = folder / "evaluations"
        window.evaluate.runFinished.connect(self.run_finished)

    def tick(self) -> None:
        view = self.window.evaluate
        if view.running:
            if self.started % 2 == 0:
                view.stop()
            return
        if self.window.page != "Evaluate" or self.window.host.state != "ready":
            return
        view.path.setText(str(self.prompts))
        view.max_tokens.setValue(EVALUATE_TOKENS)
        pool = self.window.host.pool
        waiting = [name for name in pool.names if name not in self.bases] if pool is not None else []
        base = waiting[0] if waiting and self.started % 2 == 0 else base_in_turn(self.window, self.started)
        if base is None or not view.pick_base(base):
            self.problems.append(f"evaluate lists no base {base}")
            return
        view.tick_all(True)
        if view.start():
            self.started += 1
        else:
            self.problems.append(f"evaluation did not start: {view.banner.text}")

    def run_finished(self) -> None:
        self.finished += 1
        view = self.window.evaluate
        if view.banner.kind == "error":
            self.problems.append(f"evaluation failed: {view.banner.text}")
        elif view.results is not None and view.summary.text().startswith("Saved"):
            self.bases.add(view.results.model)


class MergeActions:
    """The soak's Library actions: while the Library page shows, "Merge and export" of one adapter
    into its base is kept going (each base in turn, ``base_in_turn``, its adapters in turn;
    a swapped-out base is merged from its files), every second merge cancelled as soon as it
    starts; a merged folder is deleted once written, and the merged adapter's "Warm at start"
    toggled (its base leased: a restart while it waits for a swap ends it, which is no problem).
    Errors (not cancellations) are problems; the bases merged into are counted."""

    def __init__(self, window: MainWindow, folder: Path) -> None:
        self.window = window
        self.folder = folder / "merges"
        self.started = self.finished = self.cancelled = self.warm_toggles = 0
        self.bases: set[str] = set()  # bases a merge was written from
        self.warm_pending: tuple[str, bool] | None = None
        self.problems: list[str] = []
        self.task = None

    def tick(self) -> None:
        self.check_warm()
        if self.task is not None or self.window.page != "Library" or self.window.host.state != "ready":
            return
        pool, base = self.window.host.pool, base_in_turn(self.window, self.started)
        if pool is None or base is None:
            return
        names = sorted(pool.adapters_of(base))
        if not names:
            return
        dialog = self.window.library.open_merge_dialog()
        dialog.pick_base(base)
        merged = names[(self.started // 4) % len(names)]
        dialog.set_checked({merged: 1.0})
        if dialog.checked() != [(merged, 1.0)]:
            self.problems.append(f"the merge dialog does not list {merged} under base {base}")
            return
        out = self.folder / f"merge-{self.started}"
        dialog.out.setText(str(out))
        dialog.name.setText(f"soak-merge-{self.started}")
        task = dialog.start_merge()
        if task is None:
            self.problems.append(f"merge did not start: {dialog.banner.text}")
            return
        self.task = task
        self.started += 1
        task.done.connect(lambda: self.merge_done(out, merged, base))
        if self.started % 2 == 0:
            task.cancel()

    def merge_done(self, out: Path, name: str, base: str) -> None:
        self.task = None
        dialog = self.window.library.merge_dialog
        banner = dialog.banner if dialog is not None else None
        if banner is not None and banner.kind == "success":
            self.finished += 1
            self.bases.add(base)
            shutil.rmtree(out, ignore_errors=True)
            self.toggle_warm(name)
        elif banner is not None and banner.text.startswith("Merge cancelled"):
            self.cancelled += 1
        else:
            self.problems.append(f"merge failed: {banner.text if banner else '?'}")
        if dialog is not None:
            dialog.close()

    def toggle_warm(self, name: str) -> None:
        """Flip the adapter's *Warm at start*; ``tick`` counts it once the library shows it."""
        record = self.window.library.registry.find(name)
        if record is not None:
            self.window.library.set_warm(name, not record.warm)
            self.warm_pending = (name, not record.warm)

    def check_warm(self) -> None:
        if self.warm_pending is None:
            return
        name, expected = self.warm_pending
        record = self.window.library.registry.find(name)
        if record is not None and record.warm == expected:
            self.warm_toggles += 1
            self.warm_pending = None
        elif self.window.library.banner.kind == "error":
            text = self.window.library.banner.text
            if "restarted while this waited" not in text:  # a restart during a swap: not a problem
                self.problems.append(f"warm toggle failed: {text}")
            self.warm_pending = None


class PullActions:
    """The soak's *Pull from Hub…*: while the Library page shows, the adapter repository of one
    base (each base in turn, ``base_in_turn``) is pulled onto that base with the pull dialog
    (its first pull downloads, the next ones find it in the library; each leases the base, so a
    swapped-out one is loaded; a restart cancels it). Errors are problems; the bases pulled onto
    are counted."""

    def __init__(self, window: MainWindow, repos: list[str]) -> None:
        self.window = window
        self.repos = repos
        self.started = 0
        self.bases: set[str] = set()
        self.problems: list[str] = []
        self.task = None

    def tick(self) -> None:
        window = self.window
        pool, base = window.host.pool, base_in_turn(window, self.started)
        if self.task is not None or window.page != "Library" or pool is None or base is None:
            return
        index = pool.names.index(base)
        window.library.pull_button.click()
        dialog = window.pull_dialog
        if dialog is None:
            self.problems.append("the pull dialog did not open")
            return
        dialog.show_bases(base)
        task = dialog.start_pull(self.repos[index % len(self.repos)], f"soak-pulled-{index}")
        if task is None:
            self.problems.append(f"pull did not start: {dialog.banner.text}")
            return
        self.task = task
        self.started += 1
        task.done.connect(lambda: self.pull_done(base))

    def pull_done(self, base: str) -> None:
        self.task = None
        dialog = self.window.pull_dialog
        if dialog is not None and dialog.banner.kind == "success":
            self.bases.add(base)
        elif dialog is not None and not dialog.banner.text.startswith("Pull cancelled"):
            self.problems.append(f"pull onto {base} failed: {dialog.banner.text}")
        if dialog is not None:
            dialog.close()


class BaseFilterActions:
    """The soak's Library base filter: while the Library page shows, the next base is chosen each
    tick; a listed adapter of another base's weights is a problem."""

    def __init__(self, window: MainWindow) -> None:
        self.window = window
        self.filtered = 0
        self.problems: list[str] = []

    def tick(self) -> None:
        library = self.window.library
        if self.window.page != "Library" or library.base_filter.count() < 2:
            return
        combo = library.base_filter
        combo.setCurrentIndex((combo.currentIndex() + 1) % combo.count())
        key = combo.currentData()
        shown = [library.registry.find(name) for name in library.names()]
        wrong = [r.name for r in shown if r is not None and key is not None and key != base_key(r)]
        if wrong:
            self.problems.append(f"base filter {combo.currentText()} lists {wrong}")
        self.filtered += 1


class ArenaActions:
    """The soak's Arena: an arena of the base and every adapter of the first base is started while
    the Arena page shows (again after each restart stops it); each round shown gets the next vote
    of 1-4 and Enter, every third round judged by the base first. A banner error is a problem;
    votes, judged rounds and rounds whose names stayed hidden until the vote are counted."""

    def __init__(self, window: MainWindow) -> None:
        self.window = window
        self.votes = self.judged = self.hidden = 0
        self.problems: list[str] = []

    def tick(self) -> None:
        view = self.window.arena
        session = view.session
        if view.banner.kind == "error" and view.banner.text:
            self.problems.append(f"arena: {view.banner.text}")
            view.banner.clear()
        if session is None or not session.running:
            if self.window.page == "Arena" and self.window.host.state == "ready":
                self.start()  # refused with a warning while the first base is parked: tried again
            return
        if session.current is None or view.judge_task is not None:
            return
        if session.revealed:
            view.next_round()
        elif self.votes % 3 == 2 and session.judge_vote is None:
            view.judge_pick.setCurrentText(BASE)
            if not view.ask_judge():
                self.problems.append("the arena's judge did not start")
        else:
            self.hidden += view.left.name.text() == "Model A" and view.right.name.text() == "Model B"
            self.judged += session.judge_vote is not None
            view.vote(VERDICTS[self.votes % len(VERDICTS)])
            self.votes += 1

    def start(self) -> None:
        view = self.window.arena
        view.relist()
        view.setup.tick(
            [view.setup.contenders.item(row).text() for row in range(view.setup.contenders.count())]
        )
        view.setup.prompts.setPlainText("Say hi.\nName a colour.")
        view.setup.max_tokens.setValue(ARENA_TOKENS)
        if not view.start() and view.banner.kind == "error":
            self.problems.append(f"the arena did not start: {view.banner.text}")


class RunWriter:
    """A training run's output folder, written on its own thread the way Trainer writes it: every
    ``RUN_SAVE_S`` a ``checkpoint-N/`` (the demo pirate adapter's weights scaled by the step, each
    file in slow pieces, ``trainer_state.json`` last), the oldest deleted past ``RUN_KEPT``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir()
        self.source = demo_adapter_dirs()["demo-pirate"]
        self.written: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="soak-run-writer", daemon=True)

    def run(self) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(self.source / "adapter_model.safetensors"))
        history: list[dict] = []
        step = 0
        while not self.stop.wait(RUN_SAVE_S):
            step += 10
            history.append({"step": step, "loss": 2.0 / (1 + step / 10), "eval_loss": 2.1 / (1 + step / 10)})
            scale = min(1.0, step / 40)
            scaled = {name: (t.float() * scale).to(t.dtype) for name, t in tensors.items()}
            target = self.folder / f"checkpoint-{step}"
            target.mkdir()
            scratch = self.folder / f".scratch-{step}.safetensors"
            save_file(scaled, str(scratch), metadata={"format": "pt"})
            self.write_slowly(
                target / "adapter_config.json", (self.source / "adapter_config.json").read_bytes()
            )
            self.write_slowly(target / "adapter_model.safetensors", scratch.read_bytes())
            scratch.unlink()
            state = {"global_step": step, "log_history": history}
            self.write_slowly(target / TRAINER_STATE, json.dumps(state).encode())
            self.written.append(step)
            for old in self.written[:-RUN_KEPT]:
                shutil.rmtree(self.folder / f"checkpoint-{old}", ignore_errors=True)

    def write_slowly(self, path: Path, data: bytes) -> None:
        piece = len(data) // 3 + 1
        with path.open("wb") as handle:
            for begin in range(0, len(data), piece):
                handle.write(data[begin : begin + piece])
                handle.flush()
                time.sleep(0.2)


class RunsActions:
    """The soak's Runs view: from the first start it follows ``RunWriter``'s folder, scored on the
    Evaluate prompt set (each restart resumes it); a banner error is a problem; the checkpoints it
    imported (each once), scored and the best are counted at the end."""

    def __init__(self, window: MainWindow, writer: RunWriter, prompts: Path) -> None:
        self.window = window
        self.writer = writer
        self.prompts = prompts
        self.watching = False
        self.refreshes = 0
        self.problems: list[str] = []
        window.runs.refreshed.connect(self.count_refresh)

    def count_refresh(self) -> None:
        self.refreshes += 1

    def tick(self) -> None:
        view = self.window.runs
        if view.banner.kind == "error" and view.banner.text:
            self.problems.append(f"runs: {view.banner.text}")
            view.banner.clear()
        if self.watching or self.window.host.state != "ready":
            return
        view.watch_form.folder.setText(str(self.writer.folder))
        view.watch_form.name.setText(RUN_NAME)
        view.watch_form.prompts.setText(str(self.prompts))
        if view.watch() is None:
            self.problems.append(f"the run was not watched: {view.banner.text}")
        self.watching = True

    def result(self) -> dict:
        registry = self.window.host.registry
        checkpoints = registry.checkpoints(RUN_NAME) if self.watching else []
        run = registry.run(RUN_NAME) if checkpoints else None
        return {
            "run_written": list(self.writer.written),
            "run_imported": [c.adapter for c in checkpoints],
            "run_steps": [c.step for c in checkpoints],
            "run_scored": sum(c.scores is not None for c in checkpoints),
            "run_gone": sum(c.gone for c in checkpoints),
            "run_best": run.best if run is not None else None,
            "run_latest": registry.get(f"{RUN_NAME}@latest").name if checkpoints else None,
            "run_view_refreshes": self.refreshes,
        }


class EndpointTraffic:
    """A client of the window's endpoint on its own thread: one short completion a second, for
    each of ``models`` in turn (an adapter of each base)."""

    def __init__(self, window: MainWindow, models: list[str]) -> None:
        self.window = window
        self.models = models
        self.answered_by: dict[str, int] = dict.fromkeys(models, 0)
        self.answered = 0
        self.refused = 0  # while the endpoint restarts with the engine: expected
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="soak-client", daemon=True)

    def run(self) -> None:
        sent = 0
        while not self.stop.wait(1.0):
            url = self.window.control.url
            if not url:
                continue
            model = self.models[sent % len(self.models)]
            sent += 1
            body = json.dumps({"model": model, "prompt": "Ahoy", "max_tokens": 4}).encode()
            request = urllib.request.Request(
                f"{url}/v1/completions", body, {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=60) as reply:
                    json.loads(reply.read())
                self.answered += 1
                self.answered_by[model] += 1
            except (OSError, ValueError):
                self.refused += 1


class Soak(QObject):
    """Drives the window on a timer (see the module docstring)."""

    def __init__(self, window: MainWindow, seconds: float, restarts: int) -> None:
        super().__init__(window)
        self.window = window
        self.seconds = seconds
        self.restarts = restarts
        self.started = 0.0
        self.page_since = 0.0
        self.page = 0
        self.restarts_done = 0
        self.restart_pending = False
        self.compares = 0
        self.compares_at_start = 0  # compares finished when the running engines started
        self.replica_compares = 0  # compares run on a replica set
        self.replica_panels_seen = 0  # most replica panels the Monitor showed
        self.usage_rows_seen = 0  # most rows the Monitor's usage table showed
        self.base_panels_seen = 0  # most base panels the Monitor showed
        self.base_states_seen: set[str] = set()  # loaded / swapped out / loading, as the Monitor showed
        self.two_base_compares = 0  # compares with columns of two bases
        self.own_slots_checked = 0  # restarts after which the second base's own slots were checked
        self.prefix_caching_checked = 0  # restarts after which every base's prefix caching was checked
        self.prefix_cache_lines: set[str] = set()  # "off", "on", "hits": what the Monitor's line showed
        self.cached_follow_up_columns = 0  # follow-up columns that showed cached prompt tokens
        self.swap_loads: dict[int, int] = {}  # restarts before a pool -> its base loads after its start
        self.started_loads = 0  # base loads of the running pool when it started
        self.base_filters: BaseFilterActions | None = None  # set by main()
        self.traffic: EndpointTraffic | None = None  # set by main()
        self.chat_runs = 0
        self.format_folder: Path | None = None  # a float base folder whose format table is read; main()
        self.format_tables_checked = 0  # restarts before which Settings' format table was read
        self.strength_sweeps = 0
        self.divergences = 0
        self.compare_errors: list[str] = []
        self.problems: list[str] = []
        self.rss_after_restart: list[int] = []
        self.none_refs: list[int] = []
        self.timer = QTimer(self)
        self.timer.setInterval(TICK_MS)
        self.timer.timeout.connect(self.tick)
        window.host.ready.connect(self.engine_ready)
        window.host.failed.connect(lambda message: self.problems.append(f"engine failed: {message}"))
        window.compare.runFinished.connect(self.compare_finished)
        self.evaluate_actions: EvaluateActions | None = None  # set by main()
        self.merge_actions: MergeActions | None = None  # set by main()
        self.pull_actions: PullActions | None = None  # set by main()
        self.arena_actions: ArenaActions | None = None  # set by main()
        self.runs_actions: RunsActions | None = None  # set by main()
        window.compare.divergenceFinished.connect(lambda: divergence_finished(self))

    def engine_ready(self) -> None:
        self.started_loads = sum(self.base_loads().values())
        self.compares_at_start = self.compares
        if not self.timer.isActive():  # the first start
            self.started = self.page_since = time.monotonic()
            self.none_refs.append(sys.getrefcount(None))
            self.timer.start()
            return
        self.restart_pending = False
        self.restarts_done += 1
        self.check_own_slots()
        self.check_prefix_caching()
        return_freed_memory()  # what stays resident, not the allocator's free pages
        self.rss_after_restart.append(psutil.Process().memory_info().rss)

    def compare_finished(self) -> None:
        compare = self.window.compare
        self.compares += 1
        if isinstance(self.window.host.engine, ReplicaSet):
            self.replica_compares += 1
        if len(set(compare.column_bases)) > 1:
            self.two_base_compares += 1
        self.check_cached_tokens()
        self.compare_errors += [f"{c.name}: {c.error}" for c in compare.columns if c.error]

    def tick(self) -> None:
        now = time.monotonic()
        elapsed = now - self.started
        # the time and at least one compare per restart, however long a busy machine makes that
        work_done = self.restarts_done >= self.restarts and self.compares >= self.restarts
        if elapsed >= self.seconds and work_done and not self.restart_pending:
            self.finish()
            return
        if elapsed >= self.seconds + STUCK_AFTER_S:
            self.problems.append(self.stuck_report())
            self.finish()
            return
        if now - self.page_since >= PAGE_S:
            self.page_since = now
            self.page = (self.page + 1) % len(PAGES)
            self.window.show_page(PAGES[self.page])
            if self.page == 0:  # once a tour of every view: the other theme
                app = checked_application()
                set_theme(app, "dark" if self.page_tours() % 2 else "light")
        if self.evaluate_actions is not None:
            self.evaluate_actions.tick()
        if self.merge_actions is not None:
            self.merge_actions.tick()
        if self.pull_actions is not None:
            self.pull_actions.tick()
        if self.base_filters is not None:
            self.base_filters.tick()
        if self.arena_actions is not None:
            self.arena_actions.tick()
        if self.runs_actions is not None:
            self.runs_actions.tick()
        if self.window.host.state != "ready":
            return
        self.swap_loads[self.restarts_done] = sum(self.base_loads().values()) - self.started_loads
        if self.window.page == "Monitor":
            self.watch_bases()
            self.usage_rows_seen = max(self.usage_rows_seen, self.window.monitor.usage.table.rowCount())
        if self.window.control.state == "off" and self.traffic is not None:
            self.window.server.start()  # at the first start, and if a restart left it off
        due = (self.restarts_done + 1) * self.seconds / (self.restarts + 1)
        # each start serves a compare before the next restart (a busy machine makes one slow)
        compared = self.compares > self.compares_at_start
        ready = compared and self.swap_seen()
        if not self.restart_pending and self.restarts_done < self.restarts and elapsed >= due and ready:
            self.restart()
        elif not self.window.compare.running and not self.window.compare.divergence_busy:
            if self.compares % 2:
                start_chat_compare(self)
            else:
                self.start_compare()

    def stuck_report(self) -> str:
        """What the run waits for, and where every thread is."""
        window = self.window
        waits = {
            "host_state": window.host.state,
            "restarts_done": self.restarts_done,
            "restart_pending": self.restart_pending,
            "swap_seen": self.swap_seen(),
            "compares": self.compares,
            "compares_at_start": self.compares_at_start,
            "compare_running": window.compare.running,
            "divergence_busy": window.compare.divergence_busy,
            "compare_banner": window.compare.banner.text,
            "settings_banner": window.settings.banner.text,
            "evaluate_running": window.evaluate.running,
            "merge_task": self.merge_actions is not None and self.merge_actions.task is not None,
            "pull_task": self.pull_actions is not None and self.pull_actions.task is not None,
        }
        pool = window.host.pool
        if pool is not None:
            waits["bases"] = {
                name: {
                    "engine": type(pool.base(name).engine).__name__,
                    "parked": pool.base(name).parked is not None,
                    "leases": pool.base(name).leases,
                    "loading": pool.base(name).loading,
                    "unloading": pool.base(name).unloading,
                    "waiting": pool.waiting(name),
                }
                for name in pool.names
            }
        run = window.compare.run
        if run is not None:
            waits["columns"] = [
                f"{c.name}@{c.base}: id={c.request_id} tokens={c.tokens} done={c.output is not None}"
                for c in run.columns
            ]
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        stacks = [
            f"--- {names.get(ident, ident)}\n" + "".join(project_frames(frame))
            for ident, frame in sys._current_frames().items()
        ]
        return f"stuck {self.seconds + STUCK_AFTER_S:.0f} s in: {json.dumps(waits)}\n" + "\n".join(stacks)

    def swap_seen(self) -> bool:
        """Whether the pool that has room for one of two bases (started by restart SWAP_RESTART + 1)
        swapped one in (its compares of both bases and the endpoint's traffic to each do): that
        pool is not restarted before it has."""
        pool = self.window.host.pool
        if self.restarts_done != SWAP_RESTART + 1 or pool is None or len(pool.names) < 2:
            return True
        return self.swap_loads.get(self.restarts_done, 0) >= 1

    def watch_bases(self) -> None:
        monitor = self.window.monitor
        self.base_panels_seen = max(self.base_panels_seen, len(monitor.bases))
        self.base_states_seen |= {panel.state for panel in monitor.bases}
        replicas = max((len(panel.replicas) for panel in monitor.bases), default=0)
        self.replica_panels_seen = max(self.replica_panels_seen, replicas)
        text = monitor.stats.text()
        if text.startswith("waiting for the engine") or text == "no engine":  # a restart: no metrics yet
            return
        if "prefix cache: off" in text:
            self.prefix_cache_lines.add("off")
        elif "prefix cache: hit rate" in text:
            hits = monitor.last is not None and monitor.last.prefix_cache_hit_tokens > 0
            self.prefix_cache_lines.add("hits" if hits else "on")
        else:
            self.problems.append(f"the Monitor shows no prefix cache line: {text}")

    def page_tours(self) -> int:
        return int((time.monotonic() - self.started) / (PAGE_S * len(PAGES)))

    def start_compare(self) -> None:
        """Every listed adapter and base (the base picker on all bases, or on one, in turn);
        every fourth time one adapter's strength sweep instead."""
        compare = self.window.compare
        compare.max_tokens.setValue(COMPARE_TOKENS)
        compare.temperature.setValue(0.7)
        pool = self.window.host.pool
        bases = pool.names if pool is not None else []
        served = sorted(name for base in bases for name in pool.adapters_of(base)) if pool else []
        if self.compares % 4 == 2 and served:
            compare.pick_base(None)
            compare.sweep_strength(served[self.strength_sweeps % len(served)])
            self.strength_sweeps += 1
        else:
            picks = [None, *bases] if len(bases) > 1 else [None]
            compare.pick_base(picks[(self.compares // 2) % len(picks)])
            compare.tick_all(True)
        if not compare.start():
            self.problems.append(f"compare did not start: {compare.banner.text}")

    def restart(self) -> None:
        settings = self.window.settings
        self.window.show_page("Settings")
        self.read_format_table()
        settings.max_loras.setValue(3 if settings.max_loras.value() == 2 else 2)
        settings.enable_prefix_caching.setChecked(self.restarts_done != PREFIX_CACHE_OFF_RESTART)
        settings.devices.setText("cpu,cpu" if self.restarts_done % 2 else "")
        if settings.extra_model_entries():  # room for one base after the third restart, else for all
            settings.max_resident_bases.setValue(1 if self.restarts_done == SWAP_RESTART else 0)
            settings.extra_models.setCurrentRow(0)  # the second base: its own slots every other start
            settings.own_max_loras.setValue(OWN_SLOTS if self.restarts_done % 2 == 0 else 0)
        self.restart_pending = True
        if not settings.apply():
            self.problems.append(f"settings refused: {settings.banner.text}")
            self.restart_pending = False

    def read_format_table(self) -> None:
        """Settings' table of formats for a float folder base under every quantization choice (the
        chosen row in bold, none for a checkpoint kind it is not), then the base as it was."""
        settings, folder = self.window.settings, self.format_folder
        if folder is None:
            return
        source = next(b for b in (settings.embedded, settings.folder, settings.hub) if b.isChecked())
        model, index = settings.model.text(), settings.quantization.currentIndex()
        settings.folder.setChecked(True)
        settings.model.setText(str(folder))
        for choice in range(settings.quantization.count()):
            settings.quantization.setCurrentIndex(choice)
            table, wanted = settings.format_costs.text(), settings.quantization.itemData(choice)
            bold = table.count("<b>")
            if "<td>bf16</td>" not in table.replace("<b>", "").replace("</b>", ""):
                self.problems.append(f"the format table of {folder} lists no bf16 row: {table[:200]}")
            elif bold != (4 if wanted in ("", "fp8", "int4") else 0):  # a row of 4 cells, or none
                self.problems.append(f"quantization {wanted!r}: {bold} bold cells in the format table")
        source.setChecked(True)
        settings.model.setText(model)
        settings.quantization.setCurrentIndex(index)
        self.format_tables_checked += 1

    def check_own_slots(self) -> None:
        """After a restart, the second base's engine has the slots its entry sets, else the Engine's."""
        pool, settings = self.window.host.pool, self.window.settings
        if pool is None or len(pool.names) < 2:
            return
        wanted = OWN_SLOTS if self.restarts_done % 2 else settings.max_loras.value()
        got = pool.base(pool.names[1]).config.max_loras
        if got != wanted:
            self.problems.append(f"the second base started with {got} slots, not {wanted}")
        self.own_slots_checked += 1

    def check_prefix_caching(self) -> None:
        """After a restart, every base runs with prefix caching as Settings set it."""
        pool = self.window.host.pool
        wanted = self.restarts_done - 1 != PREFIX_CACHE_OFF_RESTART
        got = {name: pool.base(name).config.enable_prefix_caching for name in pool.names} if pool else {}
        if set(got.values()) != {wanted}:
            self.problems.append(f"prefix caching {got} after restart {self.restarts_done}, not {wanted}")
        self.prefix_caching_checked += 1

    def check_cached_tokens(self) -> None:
        """A follow-up's finished columns show their prompt's tokens and those the cache held."""
        compare = self.window.compare
        if compare.conversation is None or compare.conversation.turns < 2:
            return
        for column in compare.columns:
            if not column.done or column.error or column.finish_reason == "abort":
                continue
            shown = f"prompt {column.prompt_tokens} tok ({column.cached_tokens} cached)"
            if column.cached_tokens is None or shown not in column.stats.text():
                self.problems.append(f"follow-up column {column.name} shows {column.stats.text()!r}")
            elif column.cached_tokens > 0:
                self.cached_follow_up_columns += 1

    def base_loads(self) -> dict[str, int]:
        """Each base's engine starts in the pool running now (a swap is one more)."""
        pool = self.window.host.pool
        return {name: pool.base(name).loads for name in pool.names} if pool is not None else {}

    def resident_engines(self) -> int:
        """Engines the pool holds now, loaded and parked (a replica set's replicas each)."""
        pool = self.window.host.pool
        return sum(len(replicas_of(engine)) for _, engine in pool.engines()) if pool is not None else 0

    def finish(self) -> None:
        self.timer.stop()
        if self.traffic is not None:
            self.traffic.stop.set()
            self.traffic.thread.join(90)
        self.none_refs.append(sys.getrefcount(None))
        self.window.compare.stop()
        self.window.arena.stop()
        if self.runs_actions is not None:
            self.runs_actions.writer.stop.set()
            self.runs_actions.writer.thread.join(30)
        self.result = {
            "seconds": time.monotonic() - self.started,
            "restarts": self.restarts_done,
            "compares": self.compares,
            "replica_compares": self.replica_compares,
            "replica_panels_seen": self.replica_panels_seen,
            "base_panels_seen": self.base_panels_seen,
            "base_states_seen": sorted(self.base_states_seen),
            "two_base_compares": self.two_base_compares,
            "swaps": sum(self.swap_loads.values()),
            "base_filters": self.base_filters.filtered if self.base_filters else 0,
            "endpoint_answered_by": dict(self.traffic.answered_by) if self.traffic else {},
            "usage_rows_seen": self.usage_rows_seen,
            "endpoint_answered": self.traffic.answered if self.traffic else 0,
            "usage_requests": sum(row.requests for row in self.window.control.usage.rows()),
            "chat_runs": self.chat_runs,
            "strength_sweeps": self.strength_sweeps,
            "divergences": self.divergences,
            "compare_errors": self.compare_errors,
            "problems": self.problems
            + (self.evaluate_actions.problems if self.evaluate_actions else [])
            + (self.merge_actions.problems if self.merge_actions else [])
            + (self.pull_actions.problems if self.pull_actions else [])
            + (self.base_filters.problems if self.base_filters else [])
            + (self.arena_actions.problems if self.arena_actions else [])
            + (self.runs_actions.problems if self.runs_actions else []),
            "evaluations": self.evaluate_actions.finished if self.evaluate_actions else 0,
            "merges": self.merge_actions.finished if self.merge_actions else 0,
            "merges_cancelled": self.merge_actions.cancelled if self.merge_actions else 0,
            "evaluated_bases": sorted(self.evaluate_actions.bases) if self.evaluate_actions else [],
            "merged_bases": sorted(self.merge_actions.bases) if self.merge_actions else [],
            "pulled_bases": sorted(self.pull_actions.bases) if self.pull_actions else [],
            "own_slots_checked": self.own_slots_checked,
            "prefix_caching_checked": self.prefix_caching_checked,
            "format_tables_checked": self.format_tables_checked,
            "prefix_cache_lines": sorted(self.prefix_cache_lines),
            "cached_follow_up_columns": self.cached_follow_up_columns,
            "base_names": self.window.host.pool.names if self.window.host.pool is not None else [],
            "warm_toggles": self.merge_actions.warm_toggles if self.merge_actions else 0,
            "arena_votes": self.arena_actions.votes if self.arena_actions else 0,
            "arena_hidden_until_vote": self.arena_actions.hidden if self.arena_actions else 0,
            "arena_judged": self.arena_actions.judged if self.arena_actions else 0,
            "none_refs": self.none_refs,
            "rss_after_restart": self.rss_after_restart,
            "live_engines": len(live_engines()),
            "engine_threads": sum(t.name == "engine-worker" for t in threading.enumerate()),
            "resident_engines": self.resident_engines(),
            **(self.runs_actions.result() if self.runs_actions else {}),
        }
        self.window.close()
        checked_application().quit()


def start_chat_compare(soak: Soak) -> None:
    """Compare chat actions: a follow-up to every column (a new chat every third turn), the last
    column with its own settings, and the token divergence view every other time."""
    compare = soak.window.compare
    names = compare.checked_names()
    if names:
        compare.set_column_overrides(names[-1], ColumnOverrides(max_tokens=CHAT_TOKENS, temperature=0.0))
    view = TOKENS if soak.chat_runs % 2 else MARKDOWN
    compare.view_mode.setCurrentIndex(compare.view_mode.findData(view))
    compare.raw.setChecked(False)
    compare.prompt.setPlainText(f"Follow-up {soak.chat_runs}: say more.")
    chat = compare.conversation
    follow = chat is not None and 0 < chat.turns < 3 and not chat.raw
    if not (compare.follow_up() if follow else compare.start()):
        soak.problems.append(f"chat compare did not start: {compare.banner.text}")
        return
    soak.chat_runs += 1


def divergence_finished(soak: Soak) -> None:
    banner = soak.window.compare.banner.text
    if banner.startswith("Could not score"):
        soak.problems.append(banner)
    else:
        soak.divergences += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--second-base", type=Path, default=None, help="a second base model folder")
    parser.add_argument("--second-adapter", type=Path, default=None, help="an adapter of the second base")
    parser.add_argument("--second-base-hub", default=None, help="the second base's Hub repository")
    parser.add_argument("--pull", action="append", default=[], help="an adapter repository per base")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.seconds + STUCK_AFTER_S + 60, exit=True)
    app = checked_application()
    with tempfile.TemporaryDirectory(prefix="multilora-soak-") as folder:
        prefs = Preferences(QSettings(str(Path(folder) / "settings.ini"), QSettings.Format.IniFormat))
        registry = Registry(Path(folder) / "library")
        choice = replace(EngineChoice(), device="cpu", max_loras=2)
        models = ["demo-pirate"]
        if args.second_base is not None and args.second_adapter is not None:
            second = f"{HUB_PREFIX}{args.second_base_hub}" if args.second_base_hub else str(args.second_base)
            choice = replace(choice, extra_models=(second,))
            base = describe_base(str(args.second_base))
            registry.import_folder(
                args.second_adapter, base, name=SECOND_ADAPTER, max_rank=choice.max_lora_rank
            )
            models.append(SECOND_ADAPTER)
        prefs.set_engine_choice(choice)
        window = MainWindow(prefs, registry)
        soak = Soak(window, args.seconds, args.restarts)
        soak.format_folder = args.second_base
        soak.evaluate_actions = EvaluateActions(window, Path(folder))
        soak.merge_actions = MergeActions(window, Path(folder))
        soak.base_filters = BaseFilterActions(window)
        soak.arena_actions = ArenaActions(window)
        writer = RunWriter(Path(folder) / "training-output")
        soak.runs_actions = RunsActions(window, writer, soak.evaluate_actions.prompts)
        writer.thread.start()
        if args.pull:
            soak.pull_actions = PullActions(window, args.pull)
        window.server.port.setValue(0)  # any free port
        soak.traffic = EndpointTraffic(window, models)
        soak.traffic.thread.start()
        window.resize(1280, 820)
        window.show()
        app.exec()
        args.out.write_text(json.dumps(soak.result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
