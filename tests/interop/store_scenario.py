#!/usr/bin/env python3
"""Drive a TCPStore server through a fixed scenario with PyTorch's own client.

Usage: store_scenario.py HOST PORT

Connects to the server as a pure client (is_master=False) and prints one line per step,
"step: result", so that the transcripts of two servers can be diffed. Results are normalised
only where the client itself is not deterministic: bytes are printed as repr(), large values
as length plus a hash, key listings sorted, and exceptions as their class name plus the first
line of their message (for a dropped connection only the class name, because the kernel may
report either a reset or an end of file). Nothing here hides what the server answered.

The scenario runs under torch 1.13 (legacy wire protocol) and torch 2.x (modern protocol);
operations that only the modern client has are feature-detected with hasattr() and skipped on
the legacy client, which prints "skipped (legacy client)" for them so the step lists still line
up within one torch version.

Legacy caveat, followed throughout: a torch 1.x wait (and a get, which waits first) that times
out leaves its WAIT registered on the server, because the 1.x protocol has no CANCEL_WAIT. If
the same client later set that key, the server would send a STOP_WAITING byte that the client
reads as the reply to whatever it asks next, and the connection would go out of step; PyTorch's
own server does exactly that. So keys that time out are never set again on the legacy client.
The modern client cancels its wait, and the scenario checks that setting such a key afterwards
is harmless there.

A second client, used from a helper thread, sets keys while the main client is blocked in
wait() or queue_pop(). The helper first waits for a "go" key that the main client sets right
before blocking, so the helper's write almost always reaches the server after the blocking
request; either order gives the same printed result, so this is not a correctness race.

Exit status: 0 when every step ran (the results, helper-thread failures included, are judged
by the diff), 1 on a usage error or when the first connection fails.
"""

import datetime
import hashlib
import sys
import threading

import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=10)
SHORT = datetime.timedelta(milliseconds=200)


def fmt(value):
    """Render a result so that two runs compare byte for byte."""
    if isinstance(value, bytes) and len(value) > 64:
        return "bytes(len=%d, sha256=%s)" % (len(value), hashlib.sha256(value).hexdigest()[:16])
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return repr(value)


def fmt_error(exc, with_message=True):
    name = type(exc).__name__
    if not with_message:
        return "raised " + name
    lines = str(exc).strip().splitlines()
    return "raised %s: %s" % (name, lines[0] if lines else "")


def step(name, fn, with_message=True):
    try:
        result = fmt(fn())
    except Exception as exc:  # the exception itself is the result being compared
        result = fmt_error(exc, with_message)
    print("%s: %s" % (name, result), flush=True)


def modern(store, method, group=None):
    """True when the client has the given torch 2.x method; prints a skip line otherwise."""
    if hasattr(store, method):
        return True
    print("%s: skipped (legacy client)" % (group or method), flush=True)
    return False


def connect(host, port):
    # Positional arguments: the keyword names differ between torch 1.13 and 2.x.
    return dist.TCPStore(host, port, None, False, TIMEOUT)


def in_thread(fn):
    """Run fn on a helper thread; the returned join() reports whether it finished cleanly."""
    failure = []

    def body():
        try:
            fn()
        except Exception as exc:
            failure.append(fmt_error(exc))

    thread = threading.Thread(target=body, daemon=True)
    thread.start()

    def join():
        thread.join(TIMEOUT.total_seconds())
        if thread.is_alive():
            return "helper still running"
        return failure[0] if failure else "helper ok"

    return join


def basics(s):
    step("set_get", lambda: (s.set("a", "hello"), s.get("a"))[1])
    step("set_overwrite", lambda: (s.set("a", "world"), s.get("a"))[1])
    step("set_empty_value", lambda: (s.set("empty", ""), s.get("empty"))[1])
    step("set_bytes_value", lambda: (s.set("bin", b"\x00\x01\xff\x00x\x00"), s.get("bin"))[1])
    step("key_with_nul", lambda: (s.set("k\x00nul", "v1"), s.get("k\x00nul"))[1])
    step("key_nul_prefix_distinct", lambda: (s.set("k", "v2"), s.get("k\x00nul"), s.get("k"))[1:])
    step("key_unicode", lambda: (s.set("ключ/é", "ü"), s.get("ключ/é"))[1])
    step("key_empty", lambda: (s.set("", "root"), s.get(""))[1])
    step("num_keys_after_basics", lambda: s.num_keys())


def adds(s):
    step("add_missing_key", lambda: s.add("cnt", 5))
    step("add_negative", lambda: s.add("cnt", -7))
    step("add_zero", lambda: s.add("cnt", 0))
    step("get_counter_as_text", lambda: s.get("cnt"))
    step("add_to_numeric_set", lambda: (s.set("num", "41"), s.add("num", 1))[1])
    step("add_large", lambda: s.add("big", 2**62))
    step("add_to_int64_max", lambda: s.add("big", 2**62 - 1))
    step("add_back_to_zero", lambda: s.add("big", -(2**63 - 1)))
    step("add_to_int64_min", lambda: s.add("big", -(2**63)))
    step("add_negative_from_missing", lambda: s.add("neg", -3))
    step("get_negative_as_text", lambda: s.get("neg"))


def compare_sets(s):
    s.set("cs", "v1")
    step("compare_set_match", lambda: s.compare_set("cs", "v1", "v2"))
    step("compare_set_match_get", lambda: s.get("cs"))
    step("compare_set_mismatch", lambda: s.compare_set("cs", "nope", "v3"))
    step("compare_set_mismatch_get", lambda: s.get("cs"))
    before = s.num_keys()
    step("compare_set_missing_empty_expected", lambda: s.compare_set("cs_new", "", "fresh"))
    step("compare_set_missing_empty_expected_get", lambda: s.get("cs_new"))
    step("compare_set_missing_empty_expected_created", lambda: s.num_keys() - before)
    before = s.num_keys()
    step("compare_set_missing_nonempty_expected", lambda: s.compare_set("cs_none", "exp", "des"))
    step("compare_set_missing_nonempty_expected_created", lambda: s.num_keys() - before)
    step("compare_set_empty_expected_existing", lambda: s.compare_set("cs", "", "v4"))
    step("compare_set_binary", lambda: s.compare_set("bin", b"\x00\x01\xff\x00x\x00", b"\x00z"))
    step("compare_set_binary_get", lambda: s.get("bin"))


def waits(host, port, s):
    step("wait_present", lambda: s.wait(["a", "cnt", "empty"]))
    step("wait_present_timeout_arg", lambda: s.wait(["a"], TIMEOUT))
    step("wait_missing_times_out", lambda: s.wait(["never/1"], SHORT))
    step("usable_after_wait_timeout", lambda: (s.set("after", "x"), s.get("after"))[1])
    step("wait_partly_missing_times_out", lambda: s.wait(["a", "never/2"], SHORT))
    step("usable_after_second_timeout", lambda: s.add("cnt", 1))

    # get() on a missing key waits for it with the store timeout.
    def get_missing():
        s.set_timeout(SHORT)
        try:
            return s.get("never/3")
        finally:
            s.set_timeout(TIMEOUT)

    step("get_missing_times_out", get_missing)
    step("usable_after_get_timeout", lambda: s.get("a"))

    helper = connect(host, port)

    def late_writer():
        helper.wait(["late/go"])
        helper.set("late/1", "one")
        helper.set("late/2", b"\x00two")

    join = in_thread(late_writer)

    def wait_late():
        s.set("late/go", "1")
        return s.wait(["late/1", "late/2"], TIMEOUT)

    step("wait_for_second_client", wait_late)
    step("wait_for_second_client_helper", join)
    step("wait_for_second_client_values", lambda: [s.get("late/1"), s.get("late/2")])
    step("second_client_sees_first", lambda: helper.get("a"))

    if modern(s, "check", "modern_cancelled_wait"):
        # The modern client cancels a timed-out wait, so setting that key later must not
        # leave a stray STOP_WAITING byte in front of the next reply.
        step("modern_wait_timeout", lambda: s.wait(["cancel/1"], SHORT))
        step("modern_set_after_cancelled_wait", lambda: (s.set("cancel/1", "x"), s.get("cancel/1"))[1])
        step("modern_next_reply_in_step", lambda: s.add("cnt", 1))
        step("modern_wait_after_cancel", lambda: s.wait(["cancel/1"], SHORT))


def deletes(s):
    step("delete_existing", lambda: s.delete_key("after"))
    step("delete_absent", lambda: s.delete_key("after"))
    step("delete_never_set", lambda: s.delete_key("no/such/key"))
    step("add_after_delete", lambda: (s.delete_key("cnt"), s.add("cnt", 3))[1])
    step("num_keys_after_deletes", lambda: s.num_keys())


def big_values(s):
    mib = bytes(range(256)) * 4096  # 1 MiB with every byte value, NULs included
    step("value_1mib", lambda: (s.set("mib", mib), s.get("mib"))[1])
    step("value_1mib_roundtrip_equal", lambda: s.get("mib") == mib)
    step("compare_set_1mib", lambda: s.compare_set("mib", mib, mib[::-1]) == mib[::-1])
    step("delete_1mib", lambda: s.delete_key("mib"))


def many_keys(s):
    base = s.num_keys()
    n = 2000
    for i in range(n):
        s.set("many/%04d" % i, str(i * i))
    step("many_keys_num_keys_delta", lambda: s.num_keys() - base)
    step("many_keys_sample", lambda: [s.get("many/%04d" % i) for i in (0, 1, 999, n - 1)])
    step("many_keys_wait_all", lambda: s.wait(["many/%04d" % i for i in range(n)]))
    step("many_keys_delete_all", lambda: sum(s.delete_key("many/%04d" % i) for i in range(n)))
    step("many_keys_num_keys_after", lambda: s.num_keys() - base)


def modern_ops(host, port, s):
    if modern(s, "check"):
        step("check_present", lambda: s.check(["a", "cnt"]))
        step("check_missing", lambda: s.check(["a", "no/such/key"]))
        step("check_deleted", lambda: s.check(["after"]))
    if modern(s, "append"):
        step("append_missing", lambda: (s.append("ap", "x"), s.get("ap"))[1])
        step("append_existing", lambda: (s.append("ap", b"\x00y"), s.get("ap"))[1])
        step("append_empty", lambda: (s.append("ap", ""), s.get("ap"))[1])
    if modern(s, "multi_set"):
        step("multi_set", lambda: s.multi_set(["m/1", "m/2", "m/3"], ["a", b"\x00b", ""]))
        step("multi_get", lambda: s.multi_get(["m/1", "m/2", "m/3", "a"]))
        step("multi_set_overwrite", lambda: (s.multi_set(["m/1"], ["z"]), s.multi_get(["m/1"]))[1])
        step("multi_get_empty_list", lambda: s.multi_get([]))
        step("multi_set_empty_list", lambda: s.multi_set([], []))
    if modern(s, "queue_push"):
        step("queue_len_missing", lambda: s.queue_len("q"))
        step("queue_push", lambda: [s.queue_push("q", v) for v in ("1", b"\x002", "")])
        step("queue_len", lambda: s.queue_len("q"))
        step("queue_check", lambda: s.check(["q"]))
        step("queue_not_a_key", lambda: s.num_keys())
        step("queue_pop_fifo", lambda: [s.queue_pop("q"), s.queue_pop("q", block=False)])
        step("queue_pop_last", lambda: s.queue_pop("q", block=True))
        step("queue_len_empty", lambda: s.queue_len("q"))
        step("queue_check_empty", lambda: s.check(["q"]))
        step("queue_pop_nonblocking_empty", lambda: s.queue_pop("q", block=False))

        def pop_times_out():
            s.set_timeout(SHORT)
            try:
                return s.queue_pop("q")
            finally:
                s.set_timeout(TIMEOUT)

        step("queue_pop_blocking_times_out", pop_times_out)
        step("queue_usable_after_timeout", lambda: (s.queue_push("q", "after"), s.queue_pop("q"))[1])

        helper = connect(host, port)

        def late_pusher():
            helper.wait(["qlate/go"])
            helper.queue_push("qlate", "pushed-late")

        join = in_thread(late_pusher)

        def pop_late():
            s.set("qlate/go", "1")
            return s.queue_pop("qlate")

        step("queue_pop_blocking_second_client", pop_late)
        step("queue_pop_blocking_second_client_helper", join)
        step("queue_len_after", lambda: s.queue_len("qlate"))
    if modern(s, "list_keys"):
        step("list_keys", lambda: sorted(s.list_keys()))
        step("list_keys_matches_num_keys", lambda: len(s.list_keys()) == s.num_keys())
    if modern(s, "barrier"):
        # torch 2.x sends its own opcode for barrier(): the server adds 1 to the key's counter
        # and answers once the counter reaches world_size. Fresh connections, so that a server
        # which drops the connection here does not take the later steps with it.
        b1, b2 = connect(host, port), connect(host, port)
        join = in_thread(lambda: b2.barrier("bar", 2, TIMEOUT))
        step("barrier_two_clients", lambda: b1.barrier("bar", 2, TIMEOUT))
        step("barrier_two_clients_helper", join)
        step("barrier_counter", lambda: s.get("bar"))
        step("barrier_passed_returns_at_once", lambda: b1.barrier("bar", 2, SHORT))
        step("barrier_world_1", lambda: b1.barrier("bar1", 1))
        step("barrier_times_out", lambda: b1.barrier("bar_to", 2, SHORT))
        step("barrier_timed_out_counter", lambda: b1.get("bar_to"))
        step("barrier_usable_after_timeout", lambda: b1.add("bar_to", 1))
        step("barrier_next_reply_in_step", lambda: b1.get("a"))
        if hasattr(s, "list_keys"):
            step("list_keys_after_barrier", lambda: sorted(s.list_keys()))


def bad_add(host, port, s):
    # ADD on a value that is not a decimal integer: PyTorch's servers drop that connection
    # (both 1.13 and 2.x) and keep serving everyone else.
    victim = connect(host, port)
    victim.set("text", "abc")
    step("add_on_non_integer", lambda: victim.add("text", 1), with_message=False)
    step("server_alive_after_bad_add", lambda: [s.get("text"), s.add("cnt", 1)])


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: store_scenario.py HOST PORT\n")
        return 1
    host, port = sys.argv[1], int(sys.argv[2])
    s = connect(host, port)
    basics(s)
    adds(s)
    compare_sets(s)
    waits(host, port, s)
    deletes(s)
    big_values(s)
    many_keys(s)
    modern_ops(host, port, s)
    bad_add(host, port, s)
    step("num_keys_final", lambda: s.num_keys())
    return 0


if __name__ == "__main__":
    sys.exit(main())
