"""What every column of a result means, with its unit: the one source of docs/results.md
(``python -m inalab.columns --markdown > docs/results.md``, ``make docs``), checked against
real runs by the tests (every column a run writes is here, and every column here is written
by some run).

A table is ``{column: (unit, meaning)}``. Units: ``s`` seconds, ``Gbps`` 10^9 bits/s,
``bytes``, ``packets``, ``count``, ``share`` (0-1), ``text``, ``bool``, ``id``, ``table`` (a
JSON object of named counters).
"""
from __future__ import annotations

import sys

Column = tuple[str, str]

RUN: dict[str, Column] = {
    "scenario": ("text", "The scenario's `name`."),
    "seed": ("id", "The seed every random draw came from; same scenario and seed, same result."),
    "outcome": ("text", "How the run went: `completed` (every job finished and every flow ended), `failed` (a job failed), "
                        "`unfinished` (none failed, but a job or flow had not ended when the run stopped) or `interrupted` "
                        "(Ctrl-C or SIGTERM). The one word to check; `inalab simulate` exits 0 only for `completed`."),
    "stopped_by": ("text", "What ended the simulation: `work_ended` (every job and flow ended: finished or failed), "
                           "`stop_time` (the scenario's `stop` came first), `idle` (no event was left while work was unfinished: "
                           "a protocol waits for ever) or `interrupted`. Emulation: `work_ended`."),
    "sim_time_s": ("s", "Simulated time at the end of the run (emulation: wall time from the jobs' start to the last end)."),
    "wall_s": ("s", "Wall-clock time the simulation took (event loop only)."),
    "events": ("count", "Events the simulator handled (0 for an emulation)."),
    "jobs": ("table", "One row per job: the `jobs` table below."),
    "iterations": ("table", "One row per job and completed iteration: the `iterations` table."),
    "links": ("table", "One row per link direction: the `links` table."),
    "switches": ("table", "One row per switch: the `switches` table."),
    "hosts": ("table", "One row per host: the `hosts` table."),
    "flows": ("table", "One row per `[[flows]]` entry: the `flows` table."),
    "timeseries": ("table", "Binned measurements in long form: the `timeseries` table."),
    "conservation": ("table", "Packet and byte conservation: the `conservation` record."),
    "captures": ("table", "The pcapng files written (`--pcap`): the `captures` table."),
    "capture_error": ("text", "Why capturing stopped early (a write error), if it did; `inalab.simulate` raises it."),
    "emulation": ("table", "`inalab emulate` only: how links were shaped, the MTU, and every switch's, PS's and socket's final "
                           "counters (docs/emulation.md)."),
}

JOBS: dict[str, Column] = {
    "id": ("id", "The job's index in `[[jobs]]`."),
    "name": ("text", "The job's `name`."),
    "scheme": ("text", "The job's scheme (`ring`, `switchml`, `atp`, ...)."),
    "kind": ("text", "`training` (a model's layers, computed and communicated) or `allreduce` (back-to-back allreduces, no compute)."),
    "workers": ("count", "Workers the job started with."),
    "status": ("text", "`finished`, `failed` (a worker or server failed, a scheme that does not go on without one, or a "
                       "result that differs from the exact sum in payload mode) or `unfinished` (not ended when the run "
                       "stopped)."),
    "finished": ("bool", "`status == \"finished\"`."),
    "reason": ("text", "Why the job did not finish: its first failure, naming the worker, server or cause, or what it had done "
                       "when the run stopped and why it stopped; empty for a finished job."),
    "failures": ("text", "Every failure the job's protocols reported (a list)."),
    "start_s": ("s", "When the job started (its `start`)."),
    "jct_s": ("s", "Job completion time: from its start to the last worker holding the last result. Missing unless finished: "
                   "an unfinished job's is never the stop time."),
    "iterations": ("count", "Iterations every live worker completed."),
    "iterations_planned": ("count", "Iterations the job was to run."),
    "mean_iteration_s": ("s", "Mean time of the completed iterations (missing when none completed)."),
    "bytes_per_iteration": ("bytes", "Tensor bytes each worker allreduces per iteration."),
    "goodput_gbps": ("Gbps", "Algorithm bandwidth (NCCL's algbw, the CLI's `algbw`): tensor bytes allreduced per worker per second "
                             "of JCT, compute time included for training jobs. Missing unless finished."),
    "busbw_gbps": ("Gbps", "Bus bandwidth (NCCL's busbw): `goodput_gbps x 2(n-1)/n` for n workers, the rate each worker's link "
                           "would carry in a ring allreduce, comparable across worker counts. Missing unless finished."),
    "comm_busy_s": ("s", "Time the first live worker had at least one allreduce outstanding (its communication time)."),
    "aggregation_gbps": ("Gbps", "Tensor bytes per worker per second of `comm_busy_s`: the rate aggregation delivered while the job "
                                 "waited on it (DSA's Fig. 10 metric over the link rate). Missing unless finished."),
    "payload_checked": ("count", "Payload mode: results compared with the exact sums (one per worker and tensor)."),
    "payload_errors": ("count", "Payload mode: results that differed from the exact sum (beyond the quantization bound for floats)."),
    "comm_share": ("share", "Derived (Python): `comm_busy_s / jct_s`, at most 1: the most a faster network could save. Finished "
                            "jobs only."),
    "compute_bound": ("bool", "Derived (Python): `comm_share` below 10 %: no network or INA scheme can save much. Finished jobs only."),
    "max_error": ("count", "`inalab emulate` only: the largest absolute error of a summed value against the exact sum."),
    "error_bound": ("count", "`inalab emulate` only: the scheme's quantization bound for the job's values."),
}

ITERATIONS: dict[str, Column] = {
    "job": ("id", "The job's `id`."),
    "iteration": ("count", "The iteration, from 0."),
    "end_s": ("s", "When the last live worker received the iteration's last result."),
    "duration_s": ("s", "From the previous iteration's end (or the job's start) to this one's."),
}

LINKS: dict[str, Column] = {
    "link": ("id", "The link's index in the built topology; each direction is its own row."),
    "src": ("text", "The sending end (node name)."),
    "dst": ("text", "The receiving end."),
    "rate_gbps": ("Gbps", "The link's rate, each direction."),
    "tx_bytes": ("bytes", "Bytes the sending port accepted for transmission, wire headers included (those still queued at the "
                          "end too)."),
    "tx_packets": ("packets", "Packets the sending port accepted."),
    "utilization": ("share", "Time the link spent transmitting over the run's simulated time."),
    "peak_bin_utilization": ("share", "The highest utilization of any time-series bin (`metrics.bin`)."),
    "drops_queue": ("packets", "Packets the sending port's full queue dropped (drop-tail)."),
    "drops_loss": ("packets", "Packets lost to injected loss (`network.link_loss`, `network.host_loss`)."),
    "ecn_marks": ("packets", "Packets ECN-marked on enqueue (queue above `network.ecn_threshold`)."),
    "max_queue_bytes": ("bytes", "The sending port's deepest queue."),
    "pfc_pauses": ("count", "PFC or credits only: times the sender was paused by the receiver (credits: times its next packet waited for credits)."),
    "pfc_paused_s": ("s", "PFC or credits only: how long the sender was paused (waited for credits) in all."),
    "pfc_pauses_sent": ("count", "PFC or credits only: PAUSE frames the receiving switch sent over this link (0 under credits)."),
    "pfc_max_ingress_bytes": ("bytes", "PFC or credits only: the most bytes from this link held at the receiver at once (0 at a host; at most `network.credit_buffer` under credits)."),
}

SWITCHES: dict[str, Column] = {
    "name": ("text", "The switch's name."),
    "programmable": ("bool", "Whether it runs INA programs (`topology.programmable`)."),
    "rx_packets": ("packets", "Packets that arrived at the switch."),
    "drops_queue": ("packets", "Packets its full egress queues dropped (summed over ports)."),
    "absorbed_packets": ("packets", "Packets its INA program consumed into a sum (reason `*_aggregated`): how aggregation works, "
                                    "not a loss. Conservation counts them as absorbed."),
    "drops_program": ("packets", "Packets its program discarded for any other reason: duplicates, stale or malformed packets, no "
                                 "receiver. `counters` has them by reason."),
    "drops_socket": ("packets", "`inalab emulate` only: datagrams the switch's socket dropped (receive buffer full)."),
    "ecn_marks": ("packets", "Packets ECN-marked at its egress ports."),
    "max_queue_bytes": ("bytes", "Its deepest egress queue."),
    "aggregators_peak": ("count", "The most aggregators (slots, descriptors) held at once."),
    "aggregators_end": ("count", "Aggregators held when the run stopped: 0 once every job ended."),
    "aggregators_released": ("count", "Aggregators jobs still held when they ended, freed by the release (0 for a protocol that "
                                      "frees its own)."),
    "counters": ("table", "The program's counters by name (docs/runtime.md, \"Counters\", and each scheme's docs), plus the "
                          "driver's: `drops_no_route`, `drops_processing` (with `network.switch_capacity`), `drops_unadmitted`, "
                          "`drops_node_failed`, `drops_link_failed`, `restarts` (failures only), `pfc_*` (PFC or credits only), `rerouted_network` "
                          "(adaptive routing only: packets sent off their default port)."),
}

HOSTS: dict[str, Column] = {
    "name": ("text", "The host's name."),
    "tx_bytes": ("bytes", "Bytes its NIC sent."),
    "tx_packets": ("packets", "Packets its NIC sent."),
    "rx_bytes": ("bytes", "Bytes delivered to it."),
    "rx_packets": ("packets", "Packets delivered to it."),
    "drops_loss": ("packets", "Packets lost to injected loss on its link (emulation: its socket's receive-buffer drops)."),
    "drops_no_endpoint": ("packets", "Packets for a port no endpoint listens on."),
    "counters": ("table", "Its protocols' counters by name (resends, timeouts, ...; each scheme's docs), plus the driver's: "
                          "`drops_link_failed`, `drops_host_failed` and `failed_at_ns` (failures only), `pfc_*` (PFC or credits only), "
                          "`cpu_busy_ns` (with `network.host_costs`: its CPU's time on packets)."),
}

FLOWS: dict[str, Column] = {
    "id": ("id", "The flow's index in `[[flows]]`."),
    "src": ("text", "Sending host."),
    "dst": ("text", "Receiving host."),
    "bytes": ("bytes", "The flow's size."),
    "bytes_received": ("bytes", "Bytes that arrived."),
    "delivered_fraction": ("share", "`bytes_received / bytes`."),
    "packets": ("packets", "Packets the flow sends."),
    "packets_received": ("packets", "Packets that arrived."),
    "packets_dropped": ("packets", "Packets lost on the way (queues, loss, failures): flows do not retransmit."),
    "status": ("text", "`delivered` (every byte arrived), `lossy` (every packet arrived or was dropped, some were dropped) or "
                       "`unfinished` (packets still to send or in flight when the run stopped)."),
    "finished": ("bool", "`status != \"unfinished\"`."),
    "start_s": ("s", "When the flow started."),
    "fct_s": ("s", "Flow completion time: from its start to its last packet's arrival or drop; missing when unfinished."),
    "first_rx_s": ("s", "First packet's arrival (missing when none arrived)."),
    "last_rx_s": ("s", "Last packet's arrival (missing when none arrived)."),
}

TIMESERIES: dict[str, Column] = {
    "t_s": ("s", "The bin's start (bins are `metrics.bin` wide)."),
    "metric": ("text", "What `value` measures; one of the metrics below."),
    "entity": ("text", "A link direction `a->b`, or a switch's name."),
    "value": ("", "The metric's value in the bin, in the metric's unit."),
}

METRICS: dict[str, Column] = {
    "link_utilization": ("share", "Per link direction: the share of the bin the link spent transmitting."),
    "queue_bytes_max": ("bytes", "Per link direction: the sending port's deepest queue in the bin."),
    "aggregators_in_use": ("count", "Per switch: the most aggregators held in the bin."),
}

CONSERVATION: dict[str, Column] = {
    "sent_packets": ("packets", "Packets hosts sent."),
    "created_packets": ("packets", "Packets switch programs emitted beyond those they took in (results, multicast copies); "
                                   "negative if they consumed more than they emitted without ending them as absorbed or lost."),
    "delivered_packets": ("packets", "Packets delivered to hosts."),
    "absorbed_packets": ("packets", "Packets switch programs consumed into sums (`switches.absorbed_packets` summed): not a loss."),
    "lost_packets": ("packets", "Every other packet that ended before a host: queue drops, injected loss, failures, no route, and "
                                "packets programs discarded (duplicates, stale, malformed)."),
    "in_flight_packets": ("packets", "Packets still queued or on a wire when the run stopped."),
    "sent_bytes": ("bytes", "The same for bytes."),
    "created_bytes": ("bytes", "The same for bytes."),
    "delivered_bytes": ("bytes", "The same for bytes."),
    "absorbed_bytes": ("bytes", "The same for bytes."),
    "lost_bytes": ("bytes", "The same for bytes."),
    "in_flight_bytes": ("bytes", "The same for bytes."),
    "holds": ("bool", "`sent + created = delivered + absorbed + lost + in flight`, for packets and for bytes. Every run of the "
                      "test suite checks it."),
}

CAPTURES: dict[str, Column] = {
    "point": ("text", "The capture point (`h3`, `s0:2`, `s0-s1`)."),
    "path": ("text", "The pcapng file written."),
    "packets": ("packets", "Packets written to it."),
}

SUMMARY: dict[str, Column] = {
    **{k: RUN[k] for k in ("scenario", "seed", "outcome", "stopped_by", "sim_time_s", "wall_s", "events")},
    "jobs": ("table", "Per job: `id`, `name`, `scheme`, `kind`, `workers`, `status`, `reason`, `finished`, `jct_s`, `iterations`, "
                      "`iterations_planned`, `mean_iteration_s`, `goodput_gbps`, `busbw_gbps`, `comm_share`, `compute_bound`, as in "
                      "the `jobs` table (missing values are `null`)."),
    "flows": ("table", "`null` without flows; else `count`, how many are `delivered`, `lossy` and `unfinished`, `bytes`, "
                       "`bytes_received`, `delivered_fraction` and the longest `fct_s` (`max_fct_s`)."),
    "problems": ("text", "One line per job that did not finish (and for flows that did not end), naming why; empty when the run "
                         "completed."),
    "conservation_holds": ("bool", "`conservation.holds`."),
}

SWEEP: dict[str, Column] = {
    "point": ("id", "A hash of the point's varied values and seed: its file is `point-<id>.parquet`."),
    "<field>": ("", "Each varied field (`jobs[0].allreduce`, ...) and `seed`: the point's value."),
    "status": ("text", "The point's run: `ok` (its outcome was `completed`), `failed`, `unfinished` (as `outcome`) or `error` "
                       "(the run or its measure raised)."),
    "error": ("text", "Why the point is not ok: the exception, or the run's `problems` joined."),
    "wall_s": ("s", "The run's wall time."),
    "job_id": ("id", "`jobs.id`"), "job_name": ("text", "`jobs.name`"), "job_workers": ("count", "`jobs.workers`"),
    "job_status": ("text", "`jobs.status`"), "job_reason": ("text", "`jobs.reason`"),
    "...": ("", "The other columns of the `jobs` table under their own names: `scheme`, `kind`, `finished`, `jct_s`, `iterations`, "
                "`iterations_planned`, `mean_iteration_s`, `bytes_per_iteration`, `goodput_gbps`, `busbw_gbps`, `comm_busy_s`, "
                "`aggregation_gbps`, `payload_checked`, `payload_errors`."),
}

# (section title, how to get it, columns), in the order of the reference.
TABLES: list[tuple[str, str, dict[str, Column]]] = [
    ("The run", "`result.raw` (result.json), top level", RUN),
    ("jobs", "`result.jobs`; jobs.csv", JOBS),
    ("iterations", "`result.iterations`; iterations.csv", ITERATIONS),
    ("links", "`result.links`; links.csv", LINKS),
    ("switches", "`result.switches`; switches.csv", SWITCHES),
    ("hosts", "`result.hosts`; hosts.csv", HOSTS),
    ("flows", "`result.flows`; flows.csv", FLOWS),
    ("timeseries", "`result.timeseries`; timeseries.csv (long form)", TIMESERIES),
    ("timeseries metrics", "the values of `timeseries.metric`", METRICS),
    ("conservation", "`result.conservation`; result.json", CONSERVATION),
    ("captures", "`result.captures` (with `pcap=` / `--pcap`)", CAPTURES),
    ("The summary", "`result.summary()`; `inalab simulate --json`; summary.json", SUMMARY),
    ("Sweep rows", "`inalab.sweep(...)`; `pandas.read_parquet(OUT)`", SWEEP),
]

# The row tables of a result by their ``Result.raw`` name.
TABLE_OF: dict[str, dict[str, Column]] = {"jobs": JOBS, "iterations": ITERATIONS, "links": LINKS, "switches": SWITCHES,
                                          "hosts": HOSTS, "flows": FLOWS, "timeseries": TIMESERIES, "captures": CAPTURES}

EXIT_STATUSES = [
    ("0", "The run completed: every job finished and every flow ended (a sweep: every point was ok)."),
    ("1", "It could not be carried out: an I/O error, an emulated process that died."),
    ("2", "Bad input: a scenario field, a sweep file, an option (one line `error: <field>: <message>`)."),
    ("3", "It ran, but a job failed or did not finish, or a flow did not end (a sweep: a point was not ok); the output names "
          "each and why, `--json` has `outcome` and `problems`."),
    ("130", "Stopped by Ctrl-C (SIGINT), after printing what was done; no process is left running."),
    ("143", "Stopped by SIGTERM, likewise."),
]


def undocumented(raw: dict) -> list[str]:
    """The columns of a result (``Result.raw``) that this reference does not define, as
    "table.column" (empty when every one is)."""
    out = [f"run.{k}" for k in raw if k not in RUN]
    for name, table in TABLE_OF.items():
        seen = {k for row in raw.get(name) or [] for k in row}
        out += [f"{name}.{k}" for k in sorted(seen - set(table))]
    out += [f"conservation.{k}" for k in (raw.get("conservation") or {}) if k not in CONSERVATION]
    out += [f"timeseries.metric={m}" for m in sorted({row["metric"] for row in raw.get("timeseries") or []} - set(METRICS))]
    return out


def markdown() -> str:
    """docs/results.md."""
    lines = [
        "# Result reference",
        "",
        "<!-- Generated by `python -m inalab.columns --markdown > docs/results.md` (`make docs`); do not edit by hand. -->",
        "",
        "What `inalab simulate` / `inalab.simulate` (and `inalab emulate`, which writes the same tables) return, column by",
        "column. Times are seconds and rates Gbps (10^9 bits/s); sizes are bytes on the wire unless a column says tensor bytes.",
        "A missing value (JSON `null`, NaN in a DataFrame, an empty CSV cell) means \"not measured\": a job that did not finish",
        "has no JCT or rate. Units: `share` is 0-1, `table` a JSON object or list.",
        "",
        "## The CLI's job table",
        "",
        "`inalab simulate` prints one row per job: `status` (only when a job did not finish), `workers`, `iters` (done, or",
        "done/planned), `JCT ms` (`jct_s`), `iter ms` (`mean_iteration_s`), `algbw Gbps` (`goodput_gbps`, compute included",
        "for training jobs), `busbw Gbps` (`busbw_gbps`, allreduce jobs), `comm` (`comm_share`, training jobs). A `-` is a",
        "missing value. The header says `(completed)` only when every job finished and every flow ended; otherwise it",
        "counts what failed or did not finish, and a line per job says why.",
        "",
        "## Exit statuses",
        "",
        "| status | meaning |",
        "| --- | --- |",
    ]
    lines += [f"| {code} | {text} |" for code, text in EXIT_STATUSES]
    for title, where, table in TABLES:
        lines += ["", f"## {title}", "", f"From {where}.", "", "| column | unit | meaning |", "| --- | --- | --- |"]
        lines += [f"| `{name}` | {unit or '-'} | {text.replace('|', chr(92) + '|')} |" for name, (unit, text) in table.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m inalab.columns --markdown")
    sys.stdout.write(markdown())
