#!/usr/bin/env bash
# compare.sh: libcollective against torch.distributed's gloo on the same sizes in the same run,
# with this machine's memory bandwidth to read both against.
#
#     bench/coll/compare.sh [BUILD_DIR]          # BUILD_DIR defaults to ./build
#
# For every collective in COLLS and every rank count in NPROCS it runs, under ddprun,
# coll-bench and then gloo_bench.py with the same options (ARGS), gloo once per mode in GLOO_Z,
# then membw once, and prints per collective and rank count: size, busbw of ours and of gloo
# and their ratio, time of ours and of gloo and their ratio (both ratios: above 1 means
# libcollective is better), then the memory bandwidth and the issue's targets. gloo's figure
# for a size is its best over the modes: its async operations run concurrently on its two
# worker threads, which is sometimes faster and sometimes much slower than one at a time, and
# the anchor should be gloo at its best. Before each run the script waits (WAIT_QUIET) for the
# machine to be quiet and prints the share of CPU that other processes were using over the last
# second: above 10% the figures are noisy. Everything is also written to one JSON file.
#
# Settings (environment):
#   NPROCS   rank counts (default "2 4")
#   COLLS    collectives (default "allreduce")
#   ARGS     options for both benchmarks (default "-b 8 -e 64M -f 2 -d f32")
#   PYTHON   interpreter with torch for gloo_bench.py (default /usr/bin/python3, Debian's 1.13)
#   GLOO_Z   gloo_bench.py's -z modes to run, best kept per size (default "0 1": async and
#            blocking)
#   OUT      directory for the logs and JSON files (default: a new one under ${TMPDIR:-/tmp})
#   JSON     the combined JSON file (default $OUT/compare.json)
#   MEMBW_ARGS options for membw (default "")
#   WAIT_QUIET before each run, wait up to this many seconds (default 120) for other processes
#            to use at most 10% of the CPU
#   LAT_ITERS  operations of the latency runs: 8-byte f32 allreduce with -z 1, each waited for
#            before the next is issued, for both (default 1000; 0 skips them)
#
# Exit status: 0 every run succeeded (the targets are reported, not enforced), 1 a run failed,
# 2 bad usage or missing programs.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=${1:-build}
NPROCS=${NPROCS:-"2 4"}
COLLS=${COLLS:-allreduce}
ARGS=${ARGS:-"-b 8 -e 64M -f 2 -d f32"}
PYTHON=${PYTHON:-/usr/bin/python3}
GLOO_Z=${GLOO_Z:-"0 1"}
LAT_ITERS=${LAT_ITERS:-1000}
WAIT_QUIET=${WAIT_QUIET:-120}
MEMBW_ARGS=${MEMBW_ARGS:-}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/coll-compare.XXXXXX")}
JSON=${JSON:-$OUT/compare.json}

ddprun=$BUILD/launcher/ddprun
coll_bench=${COLL_BENCH:-$BUILD/bench/coll-bench}
membw=$BUILD/bench/membw
for p in "$ddprun" "$coll_bench" "$membw"; do
    [[ -x $p ]] || { echo "compare.sh: $p not found; build first (ninja -C $BUILD)" >&2; exit 2; }
done
[[ -x $PYTHON ]] || command -v "$PYTHON" >/dev/null ||
    { echo "compare.sh: no interpreter $PYTHON" >&2; exit 2; }
mkdir -p "$OUT"

failed=0
run() { # LOG CMD...: runs CMD with its output in LOG, shows the tail on failure
    local log=$1
    shift
    if ! "$@" >"$log" 2>&1; then
        echo "compare.sh: failed: $*" >&2
        tail -n 20 "$log" >&2
        failed=1
        return 1
    fi
}

# Percent of the CPU time that was not idle over one second, from /proc/stat (nothing of ours
# runs then, so it is other processes' share).
busy() {
    local a b
    read -r -a a < <(grep '^cpu ' /proc/stat)
    sleep 1
    read -r -a b < <(grep '^cpu ' /proc/stat)
    local idle=$(((b[4] + b[5]) - (a[4] + a[5]))) total=0 i
    for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
    echo $((total > 0 ? 100 * (total - idle) / total : 0))
}

# busy, repeated while other processes use more than 10% of the CPU, for up to WAIT_QUIET
# seconds; prints the last reading.
quiet() {
    local start=$SECONDS pct
    while :; do
        pct=$(busy)
        if [[ $pct -le 10 || $((SECONDS - start)) -ge $WAIT_QUIET ]]; then
            echo "$pct"
            return
        fi
    done
}

echo "# compare.sh: ARGS='$ARGS', NPROCS='$NPROCS', COLLS='$COLLS', GLOO_Z='$GLOO_Z'; logs in $OUT" >&2
: >"$OUT/busy.txt"
for coll in $COLLS; do
    for n in $NPROCS; do
        cpu=$(quiet)
        echo "ours.$coll.$n $cpu" >>"$OUT/busy.txt"
        echo "# $coll, $n ranks: coll-bench (other processes: $cpu% CPU)" >&2
        # shellcheck disable=SC2086 # ARGS is a list of options
        run "$OUT/ours.$coll.$n.log" "$ddprun" --nproc-per-node "$n" --no-prefix \
            "$coll_bench" "$coll" $ARGS --json "$OUT/ours.$coll.$n.json" || true
        for z in $GLOO_Z; do
            cpu=$(quiet)
            echo "gloo.$coll.$n.z$z $cpu" >>"$OUT/busy.txt"
            echo "# $coll, $n ranks: gloo_bench.py -z $z (other processes: $cpu% CPU)" >&2
            # shellcheck disable=SC2086
            run "$OUT/gloo.$coll.$n.z$z.log" "$ddprun" --nproc-per-node "$n" --no-prefix \
                "$PYTHON" "$here/gloo_bench.py" "$coll" $ARGS -z "$z" \
                --json "$OUT/gloo.$coll.$n.z$z.json" || true
        done
    done
done
# Latency: 8-byte allreduce, each operation waited for before the next is issued.
if [[ $LAT_ITERS -gt 0 ]]; then
    for n in $NPROCS; do
        cpu=$(quiet)
        echo "lat.ours.$n $cpu" >>"$OUT/busy.txt"
        echo "# latency, $n ranks: coll-bench -z 1 (other processes: $cpu% CPU)" >&2
        run "$OUT/lat.ours.$n.log" "$ddprun" --nproc-per-node "$n" --no-prefix "$coll_bench" \
            allreduce -b 8 -e 8 -d f32 -z 1 -n "$LAT_ITERS" --json "$OUT/lat.ours.$n.json" || true
        cpu=$(quiet)
        echo "lat.gloo.$n $cpu" >>"$OUT/busy.txt"
        echo "# latency, $n ranks: gloo_bench.py -z 1 (other processes: $cpu% CPU)" >&2
        run "$OUT/lat.gloo.$n.log" "$ddprun" --nproc-per-node "$n" --no-prefix "$PYTHON" \
            "$here/gloo_bench.py" allreduce -b 8 -e 8 -d f32 -z 1 -n "$LAT_ITERS" \
            --json "$OUT/lat.gloo.$n.json" || true
    done
fi

echo "# membw" >&2
# shellcheck disable=SC2086
run "$OUT/membw.log" "$membw" $MEMBW_ARGS --json "$OUT/membw.json" || true

python3 - "$OUT" "$JSON" "$NPROCS" "$COLLS" "$ARGS" "$GLOO_Z" <<'EOF'
import json, os, sys

out, combined, nprocs, colls, args, gloo_z = sys.argv[1:7]
nprocs = [int(x) for x in nprocs.split()]
colls = colls.split()
gloo_z = gloo_z.split()
busy = {}
with open(os.path.join(out, "busy.txt")) as f:
    for line in f:
        k, v = line.split()
        busy[k] = int(v)

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

membw = load(os.path.join(out, "membw.json")) or []
result = {"args": args, "gloo_modes": gloo_z, "membw": membw, "busy_percent": busy,
          "runs": []}

def fmt(x, spec):
    return format(x, spec) if x is not None else "-"

for coll in colls:
    for n in nprocs:
        ours = load(os.path.join(out, f"ours.{coll}.{n}.json"))
        glooz = {z: load(os.path.join(out, f"gloo.{coll}.{n}.z{z}.json")) for z in gloo_z}
        # gloo's best (least time) per size over the modes that ran.
        g_by = {}
        for z, rows in glooz.items():
            for r in rows or []:
                if r["bytes"] not in g_by or r["time_us"] < g_by[r["bytes"]]["time_us"]:
                    g_by[r["bytes"]] = dict(r, mode=z)
        gloo = sorted(g_by.values(), key=lambda r: r["bytes"]) if g_by else None
        run = {"coll": coll, "nranks": n, "ours": ours, "gloo": glooz, "rows": []}
        result["runs"].append(run)
        others = [f"{k.split('.')[0]}{'' if k.startswith('ours') else ' -z ' + k[-1]} {v}%"
                  for k, v in busy.items() if f".{coll}.{n}" in k]
        print(f"\n## {coll}, {n} ranks" + ("" if ours else " (coll-bench failed)")
              + ("" if gloo else " (gloo_bench failed)")
              + f"; other processes' CPU before each run: {', '.join(others)}")
        print(f"{'size(B)':>10} {'ours busbw':>11} {'gloo busbw':>11} {'ratio':>7}"
              f" {'ours us':>10} {'gloo us':>10} {'ratio':>7} {'gloo -z':>7} {'wrong':>6}")
        for o in ours or []:
            g = g_by.get(o["bytes"])
            bw_ratio = (o["busbw_gbs"] / g["busbw_gbs"]) if g and g["busbw_gbs"] > 0 else None
            t_ratio = (g["time_us"] / o["time_us"]) if g and o["time_us"] > 0 else None
            wrong = "N/A" if o["wrong"] is None else str(o["wrong"])
            if g and g["wrong"]:
                wrong += f"/g{g['wrong']}"
            print(f"{o['bytes']:>10} {o['busbw_gbs']:>11.3f} {fmt(g and g['busbw_gbs'], '>11.3f')}"
                  f" {fmt(bw_ratio, '>7.2f')} {o['time_us']:>10.2f}"
                  f" {fmt(g and g['time_us'], '>10.2f')} {fmt(t_ratio, '>7.2f')}"
                  f" {(g and g['mode']) or '-':>7} {wrong:>6}")
            run["rows"].append({"bytes": o["bytes"], "ours_busbw_gbs": o["busbw_gbs"],
                                "gloo_busbw_gbs": g and g["busbw_gbs"],
                                "busbw_ratio": bw_ratio, "ours_time_us": o["time_us"],
                                "gloo_time_us": g and g["time_us"], "time_ratio": t_ratio,
                                "gloo_mode": g and g["mode"],
                                "ours_wrong": o["wrong"], "gloo_wrong": g and g["wrong"]})

lat = []
for n in nprocs:
    o = load(os.path.join(out, f"lat.ours.{n}.json"))
    g = load(os.path.join(out, f"lat.gloo.{n}.json"))
    if o or g:
        lat.append({"nranks": n, "ours_time_us": o and o[0]["time_us"],
                    "gloo_time_us": g and g[0]["time_us"],
                    "ours_wrong": o and o[0]["wrong"], "gloo_wrong": g and g[0]["wrong"]})
result["latency"] = lat
if lat:
    print("\n## 8-byte f32 allreduce, each operation waited for before the next (-z 1)")
    print(f"{'ranks':>10} {'ours us':>10} {'gloo us':>10} {'ratio':>7}")
    for r in lat:
        ratio = (r["gloo_time_us"] / r["ours_time_us"]
                 if r["ours_time_us"] and r["gloo_time_us"] else None)
        print(f"{r['nranks']:>10} {fmt(r['ours_time_us'], '>10.2f')}"
              f" {fmt(r['gloo_time_us'], '>10.2f')} {fmt(ratio, '>7.2f')}")

print()
if membw:
    by = {(m["kernel"], m["threads"]): m["gbs"] for m in membw}
    threads = sorted({m["threads"] for m in membw})
    parts = []
    for k in ("copy", "add", "read"):
        parts.append(f"{k} " + " / ".join(f"{by[(k, t)]:.1f}" for t in threads if (k, t) in by))
    print(f"# memory bandwidth (GB/s, {' / '.join(map(str, threads))} threads, arrays of "
          f"{membw[0]['bytes'] >> 20} MiB): " + ", ".join(parts))
    print("#   (busbw counts each byte once per rank; a reduction reads n inputs and writes "
          "one output, so busbw is well below these)")
else:
    print("# memory bandwidth: membw failed")

# The issue's targets: f32 allreduce busbw at 64 MiB >= 3x gloo (2 and 4 ranks); 8-byte
# allreduce <= 20 us with 2 ranks.
targets = []
for run in result["runs"]:
    if run["coll"] != "allreduce" or not run["ours"]:
        continue
    rows = {r["bytes"]: r for r in run["rows"]}
    big = rows.get(64 << 20)
    if big and (run["ours"][0]["dtype"] == "f32") and big["busbw_ratio"] is not None:
        ok = big["busbw_ratio"] >= 3
        targets.append({"target": f"allreduce f32 64 MiB busbw >= 3x gloo, {run['nranks']} ranks",
                        "value": big["busbw_ratio"], "pass": ok})
    small = rows.get(8)
    if small and run["nranks"] == 2:
        ok = small["ours_time_us"] <= 20
        targets.append({"target": "allreduce 8 B <= 20 us, 2 ranks, issued back to back",
                        "value": small["ours_time_us"], "pass": ok})
for r in lat:
    if r["nranks"] == 2 and r["ours_time_us"] is not None:
        targets.append({"target": "allreduce 8 B <= 20 us, 2 ranks, each waited for (-z 1)",
                        "value": r["ours_time_us"], "pass": r["ours_time_us"] <= 20})
for t in targets:
    print(f"# target: {t['target']}: {t['value']:.2f} -> {'PASS' if t['pass'] else 'MISS'}")
result["targets"] = targets
with open(combined, "w") as f:
    json.dump(result, f, indent=1)
    f.write("\n")
print(f"# combined JSON: {combined}")
EOF
exit $failed
