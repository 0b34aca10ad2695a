"""gloo_bench: coll-bench's measurement with torch.distributed's gloo backend, the anchor.

Run it under ddprun (or torchrun) like coll-bench, with the same options:

    ddprun --nproc-per-node 4 /usr/bin/python3 bench/coll/gloo_bench.py \\
        allreduce -b 8 -e 64M -f 2 -d f32 --json gloo.json

It joins the job through env:// (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), and for every
size issues the same warm-up and timed iterations as coll-bench: by default all of them async
(async_op=True) and then waits for each, or with -z 1 one blocking call after the other. Rank 0
prints the same columns (size, count, type, redop, root, time, algbw, busbw, #wrong, with
nccl-tests' bus factors) and, with --json, writes the same JSON keys.

What gloo cannot do is done the way a torch user would, and said in the header:
  - torch.distributed's collectives work in place, so -I (in place) changes nothing here and
    the out-of-place default still reduces the send buffer in place (no extra copy is timed);
  - gloo has no reduce_scatter: it is timed as an allreduce of the whole count*n buffer and a
    copy of this rank's block out of it;
  - allgather gathers into n views of one output tensor (gloo has no _allgather_base);
  - gloo supports neither bf16 nor AVG: asking for them is a usage error (exit 2);
  - sizes that round down to 0 elements get no row (gloo's allgather dies of SIGFPE on empty
    tensors); coll-bench prints them.

Exit status: 0 all rows correct (or -c 0), 1 wrong elements found, 2 bad usage,
3 could not join the process group.
"""

import argparse
import json
import sys
import time

COLLS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce")
DTYPES = ("f32", "f64", "f16", "bf16", "i32", "i64", "u8")
DTYPE_SIZE = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i32": 4, "i64": 8, "u8": 1}
OPS = ("sum", "avg", "max", "min", "prod")


def parse_size(flag, text):
    """'64M' -> 67108864. Suffixes K, M, G are powers of 1024, as in nccl-tests."""
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip()
    m = 1
    if t and t[-1].upper() in mult:
        m = mult[t[-1].upper()]
        t = t[:-1]
    try:
        v = int(t)
    except ValueError:
        raise SystemExit(usage_error(f"{flag}: '{text}' is not a size (N[K|M|G])"))
    if v < 0:
        raise SystemExit(usage_error(f"{flag}: '{text}' is negative"))
    return v * m


def usage_error(msg):
    print(f"gloo_bench: {msg}", file=sys.stderr)
    return 2


def sizes(minb, maxb, factor, step):
    out = []
    s = minb
    while s <= maxb:
        out.append(s)
        if factor > 1:
            if s == 0:
                s = 1
            else:
                s *= factor
        else:
            if step <= 0:
                break
            s += step
    return out


def iters_for(args, nbytes):
    """coll-bench's rule: -n iterations, fewer (at least 5) where they would move more than
    --iter-bytes (0: no limit), so that the large sizes do not dominate the run."""
    if args.iter_bytes > 0 and nbytes > 0 and args.iters * nbytes > args.iter_bytes:
        return max(min(5, args.iters), args.iter_bytes // nbytes)
    return args.iters


def bus_factor(coll, n):
    if coll == "allreduce":
        return 2.0 * (n - 1) / n
    if coll in ("reduce_scatter", "allgather"):
        return (n - 1) / n
    return 1.0


def parse_args(argv):
    p = argparse.ArgumentParser(prog="gloo_bench", description=__doc__.split("\n")[0])
    p.add_argument("coll", choices=COLLS)
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default="64M")
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-i", "--stepbytes", default="1M")
    p.add_argument("-n", "--iters", type=int, default=100)
    p.add_argument("--iter-bytes", default="1G")
    p.add_argument("-w", "--warmup-iters", type=int, default=5)
    p.add_argument("-d", "--datatype", default="f32", choices=DTYPES)
    p.add_argument("-o", "--op", default="sum", choices=OPS)
    p.add_argument("-r", "--root", type=int, default=0)
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1))
    p.add_argument("-a", "--average", type=int, default=1, choices=(0, 1, 2, 3))
    p.add_argument("-z", "--blocking", type=int, default=0, choices=(0, 1))
    p.add_argument("-I", "--inplace", action="store_true")
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args(argv)
    a.minbytes = parse_size("-b", a.minbytes)
    a.maxbytes = parse_size("-e", a.maxbytes)
    a.stepbytes = parse_size("-i", a.stepbytes)
    a.iter_bytes = parse_size("--iter-bytes", a.iter_bytes)
    if a.iters < 1:
        raise SystemExit(usage_error("-n: need at least 1 iteration"))
    if a.warmup_iters < 0:
        raise SystemExit(usage_error("-w: negative"))
    if a.stepfactor < 1:
        raise SystemExit(usage_error("-f: need a factor >= 1"))
    if a.maxbytes < a.minbytes:
        raise SystemExit(usage_error("-e: smaller than -b"))
    if a.datatype == "bf16":
        raise SystemExit(usage_error("-d bf16: gloo (torch 1.13) has no bfloat16 reductions"))
    if a.op == "avg":
        raise SystemExit(usage_error("-o avg: gloo cannot use ReduceOp.AVG"))
    return a


def main(argv):
    args = parse_args(argv)
    import torch
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo")
    except Exception as e:  # noqa: BLE001 - report whatever torch raises
        print(f"gloo_bench: init_process_group(gloo): {e}", file=sys.stderr)
        return 3
    rank = dist.get_rank()
    n = dist.get_world_size()
    if not 0 <= args.root < n:
        if rank == 0:
            usage_error(f"-r: root {args.root} is not a rank of {n}")
        return 2
    torch.set_num_threads(1)  # one core per rank, as coll-bench's ranks have

    tdt = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16,
           "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8}[args.datatype]
    rop = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
           "prod": dist.ReduceOp.PRODUCT}[args.op]
    tsize = DTYPE_SIZE[args.datatype]
    rooted = args.coll in ("broadcast", "reduce")

    def values(idx, r):
        """coll-bench's test pattern: small integers, exact in every dtype."""
        h = ((idx * 2654435761 + (r + 1) * 97) & 0xFFFFFFFF) >> 13
        if args.op == "prod":
            return 1 + ((h & 7) == 0).to(torch.int64)
        return h & 3

    def expected_reduce(idx):
        acc = None
        for r in range(n):
            v = values(idx, r)
            if acc is None:
                acc = v.clone()
            elif args.op == "sum":
                acc += v
            elif args.op == "prod":
                acc *= v
            elif args.op == "max":
                acc = torch.maximum(acc, v)
            else:
                acc = torch.minimum(acc, v)
        return acc

    def cast(v):
        # Integer types wrap like the library's (two's complement / modulo 256).
        if args.datatype == "u8":
            return (v & 0xFF).to(tdt)
        if args.datatype == "i32":
            return ((v + (1 << 31)) % (1 << 32) - (1 << 31)).to(tdt)
        return v.to(tdt)

    header(args, n, rank)
    rows = []
    total_busbw = 0.0
    nrows = 0
    any_wrong = False

    for size in sizes(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes):
        if args.coll in ("allgather", "reduce_scatter"):
            per = size // (tsize * n)
            count = per * n
        else:
            per = size // tsize
            count = per
        nbytes = count * tsize
        if count == 0:
            continue  # gloo's allgather dies of SIGFPE on empty tensors; no row for size 0
        iters = iters_for(args, nbytes)

        # Buffers: (per) or (count) elements; see the shapes in coll.h.
        if args.coll == "allreduce" or args.coll == "reduce" or args.coll == "broadcast":
            buf = torch.zeros(per, dtype=tdt)
            recv = buf
        elif args.coll == "allgather":
            send = torch.zeros(per, dtype=tdt)
            out = torch.zeros(per * n, dtype=tdt)
            views = list(out.split(per)) if per > 0 else [torch.zeros(0, dtype=tdt)] * n
        else:  # reduce_scatter, emulated
            buf = torch.zeros(per * n, dtype=tdt)
            recv = torch.zeros(per, dtype=tdt)

        # The timed data: coll-bench's pattern (not checked; any data would do).
        if args.coll == "allgather":
            send.copy_(cast(values(torch.arange(per), rank)))
        else:
            buf.copy_(cast(values(torch.arange(buf.numel()), rank)))

        def issue(async_op):
            if args.coll == "allreduce":
                return dist.all_reduce(buf, op=rop, async_op=async_op)
            if args.coll == "reduce":
                return dist.reduce(buf, dst=args.root, op=rop, async_op=async_op)
            if args.coll == "broadcast":
                return dist.broadcast(buf, src=args.root, async_op=async_op)
            if args.coll == "allgather":
                return dist.all_gather(views, send, async_op=async_op)
            w = dist.all_reduce(buf, op=rop, async_op=async_op)
            if w is not None:
                w.wait()
            recv.copy_(buf[rank * per:(rank + 1) * per])
            return None

        def run(iters):
            if args.blocking or args.coll == "reduce_scatter":
                for _ in range(iters):
                    issue(False)
            else:
                works = [issue(True) for _ in range(iters)]
                for w in works:
                    w.wait()

        run(args.warmup_iters)
        dist.barrier()
        t0 = time.perf_counter()
        run(iters)
        t1 = time.perf_counter()
        mean_us = (t1 - t0) * 1e6 / iters

        # Combine the ranks' means like nccl-tests' -a: rank 0, average, min or max.
        t = torch.tensor([mean_us], dtype=torch.float64)
        if args.average == 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t /= n
        elif args.average == 2:
            dist.all_reduce(t, op=dist.ReduceOp.MIN)
        elif args.average == 3:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        time_us = t.item()

        wrong = None
        if args.check:
            bufs = {"buf": buf, "recv": recv} if args.coll != "allgather" else \
                {"send": send, "out": out, "views": views}
            wrong = check(args, dist, torch, rank, n, per, values, expected_reduce, cast, bufs)
            w = torch.tensor([wrong], dtype=torch.int64)
            dist.all_reduce(w, op=dist.ReduceOp.SUM)
            wrong = int(w.item())
            any_wrong = any_wrong or wrong > 0

        algbw = nbytes / (time_us * 1e3) if time_us > 0 else 0.0  # GB/s, 1e9 bytes
        busbw = algbw * bus_factor(args.coll, n)
        row = {
            "coll": args.coll, "backend": "gloo", "nranks": n, "bytes": nbytes,
            "count": count, "dtype": args.datatype,
            "redop": "none" if args.coll in ("broadcast", "allgather") else args.op,
            "root": args.root if rooted else -1, "iters": iters,
            "time_us": time_us, "algbw_gbs": algbw, "busbw_gbs": busbw, "wrong": wrong,
        }
        rows.append(row)
        total_busbw += busbw
        nrows += 1
        if rank == 0:
            print(format_row(row), flush=True)

    if rank == 0:
        print(f"# Out of bounds values : {'some' if any_wrong else 0} "
              f"{'FAILED' if any_wrong else 'OK'}")
        print(f"# Avg bus bandwidth    : {total_busbw / max(nrows, 1):.4g}")
        print("#")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
                f.write("\n")
    dist.destroy_process_group()
    return 1 if any_wrong else 0


def check(args, dist, torch, rank, n, per, values, expected_reduce, cast, env):
    """One fresh operation on coll-bench's test pattern; returns this rank's wrong elements."""
    coll = args.coll
    idx = torch.arange(per * (n if coll == "reduce_scatter" else 1), dtype=torch.int64)
    if coll in ("allreduce", "reduce"):
        buf = env["buf"]
        buf.copy_(cast(values(idx, rank)))
        if coll == "allreduce":
            dist.all_reduce(buf, op=opmap(dist, args.op))
        else:
            dist.reduce(buf, dst=args.root, op=opmap(dist, args.op))
            if rank != args.root:
                return 0
        return count_wrong(torch, buf, cast(expected_reduce(idx)))
    if coll == "broadcast":
        buf = env["buf"]
        buf.copy_(cast(values(idx, args.root)) if rank == args.root else torch.zeros_like(buf))
        dist.broadcast(buf, src=args.root)
        return count_wrong(torch, buf, cast(values(idx, args.root)))
    if coll == "allgather":
        send, out, views = env["send"], env["out"], env["views"]
        send.copy_(cast(values(idx + rank * per, rank)))
        out.zero_()
        dist.all_gather(views, send)
        full = torch.arange(per * n, dtype=torch.int64)
        owner = full // per if per > 0 else full
        exp = torch.zeros(per * n, dtype=torch.int64)
        for r in range(n):
            m = owner == r
            exp[m] = values(full[m], r)
        return count_wrong(torch, out, cast(exp))
    buf, recv = env["buf"], env["recv"]
    buf.copy_(cast(values(idx, rank)))
    dist.all_reduce(buf, op=opmap(dist, args.op))
    recv.copy_(buf[rank * per:(rank + 1) * per])
    mine = idx[rank * per:(rank + 1) * per]
    return count_wrong(torch, recv, cast(expected_reduce(mine)))


def opmap(dist, op):
    return {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
            "prod": dist.ReduceOp.PRODUCT}[op]


def count_wrong(torch, got, exp):
    if got.numel() == 0:
        return 0
    return int((got != exp).sum().item())


def header(args, n, rank):
    if rank != 0:
        return
    import torch
    print(f"# gloo_bench: torch {torch.__version__} gloo, {n} ranks, {args.coll}, "
          f"minBytes {args.minbytes} maxBytes {args.maxbytes} "
          + (f"step: {args.stepfactor}(factor)" if args.stepfactor > 1
             else f"step: {args.stepbytes}(bytes)")
          + f" warmup iters: {args.warmup_iters} iters: {args.iters}"
          f" (fewer above {args.iter_bytes} bytes per size)"
          f" validation: {args.check} blocking: {args.blocking}"
          f" time: {['rank 0', 'average', 'min', 'max'][args.average]} of the ranks' means")
    if args.coll == "reduce_scatter":
        print("# gloo has no reduce_scatter: timed as allreduce of count elements + a copy of "
              "this rank's block")
    print("# torch collectives work in place: the send buffer is reduced in place")
    print("#")
    print(f"# {'size':>10} {'count':>12} {'type':>6} {'redop':>6} {'root':>5} "
          f"{'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>7}")
    print(f"# {'(B)':>10} {'(elements)':>12} {'':>6} {'':>6} {'':>5} "
          f"{'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>7}")


def format_row(row):
    wrong = "N/A" if row["wrong"] is None else str(row["wrong"])
    return (f"  {row['bytes']:>10} {row['count']:>12} {row['dtype']:>6} {row['redop']:>6} "
            f"{row['root']:>5} {row['time_us']:>10.2f} {row['algbw_gbs']:>8.3f} "
            f"{row['busbw_gbs']:>8.3f} {wrong:>7}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
