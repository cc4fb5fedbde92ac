// Probes are read-only and never mistake each other for a holder.
import assert from "node:assert/strict";
import { readFileSync, unlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import {
  acquire,
  activePid,
  ContendedError,
  held,
  inspect,
} from "../../mod.ts";
import { Child, deadPid, tempDir } from "../_helpers.ts";

describe("probes", () => {
  test("a missing file is free: held false, activePid {0, false}, inspect free", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      assert.equal(await held(path), false);
      assert.deepEqual(await activePid(path), { pid: 0, alive: false });
      const info = await inspect(path);
      assert.deepEqual(info, {
        path,
        state: "free",
        pid: 0,
        host: "",
        started: undefined,
        foreign: false,
        reason: undefined,
        runtime: "",
        meta: {},
        bootId: "",
        pidNamespace: "",
        pidValidHere: undefined,
        pidElsewhere: undefined,
        child: 0,
      });
    } finally {
      cleanup();
    }
  });

  test("two probers at once never see each other as a holder", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const dead = deadPid();
      writeFileSync(path, `${dead}\nrunlock 1\n`);
      const probers = Array.from(
        { length: 4 },
        () => new Child("probe_loop.ts", [path, "3000"]),
      );
      const results = await Promise.all(probers.map((p) => p.expect("done")));
      for (const { seen } of results) {
        assert.deepEqual(seen, { stale: 3000 });
      }
      assert.equal(readFileSync(path, "utf8"), `${dead}\nrunlock 1\n`);
    } finally {
      cleanup();
    }
  });

  test("a prober holding its shared lock makes acquire back off, not fail as held", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      writeFileSync(path, `${deadPid()}\nrunlock 1\n`);
      // flock -s stands for a prober caught in the middle of its probe; it
      // lets go when our end of its stdin closes.
      const prober = new Child("", [], undefined, [
        "flock",
        "-s",
        path,
        "sh",
        "-c",
        "echo locked; read _",
      ]);
      try {
        assert.equal((await prober.next()).text, "locked");
        assert.equal(await held(path), false);
        await assert.rejects(acquire(path), ContendedError);
        // A waiter backs off while the prober holds its shared lock, and
        // takes over once it lets go.
        const waiting = acquire(path, { timeout: 60_000 });
        prober.proc.stdin!.end();
        const lock = await waiting;
        assert.equal(await held(path), true);
        await lock.release();
      } finally {
        await prober.kill();
      }
    } finally {
      cleanup();
    }
  });

  test("a probe during a takeover (a dead pid under a held flock, for a moment) looks again instead of reporting the dead pid as the holder", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const dead = deadPid();
      writeFileSync(path, `${dead}\nrunlock 1\n`);
      // flock(1) stands for a taker: LOCK_EX on the crashed run's file, then
      // the file is gone (a real taker unlinks it and links its own; here
      // nobody follows, so the answer is "free"). Each probe makes its first
      // look before it returns its promise (and sees the dead PID under the
      // flock); the file is removed right after, in this same synchronous
      // stretch, so their next look comes after the removal however slow
      // the machine is.
      const taker = new Child("", [], undefined, [
        "flock",
        "-x",
        path,
        "sh",
        "-c",
        `echo locked; read _`,
      ]);
      assert.equal((await taker.next()).text, "locked");
      const probes = Promise.all([
        inspect(path),
        held(path),
        activePid(path),
      ]);
      unlinkSync(path);
      taker.send("go");
      const [info, isHeld, active] = await probes;
      assert.equal(info.state, "free", JSON.stringify(info));
      assert.equal(isHeld, false);
      assert.deepEqual(active, { pid: 0, alive: false });
      await taker.exited;
    } finally {
      cleanup();
    }
  });

  test("a crashed run's file that flock(1) keeps locked is still reported held, after looking again", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const dead = deadPid();
      writeFileSync(path, `${dead}\nrunlock 1\n`);
      // It holds the file until our end of its stdin closes.
      const tool = new Child("", [], undefined, [
        "flock",
        "-x",
        path,
        "sh",
        "-c",
        "echo locked; read _",
      ]);
      try {
        assert.equal((await tool.next()).text, "locked");
        const info = await inspect(path);
        assert.equal(info.state, "held");
        assert.equal(info.pid, dead);
      } finally {
        tool.proc.stdin!.end();
        await tool.kill();
      }
    } finally {
      cleanup();
    }
  });
});

describe("the record's child= line (the command runlock run handed the lock to)", () => {
  test("inspect reads child= only as ten digits from 2 up: a line not yet filled in, or read while being written, names no process", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const cases: [string, number][] = [
        ["0000012345", 12345],
        ["2147483647", 2147483647],
        ["----------", 0], // reserved, the command not started yet
        ["00000123--", 0], // a read that met the write half done
        ["--00000123", 0],
        ["12345", 0], // not ten digits
        ["0000000001", 0], // pid 1 is never a command runlock started
        ["0000000000", 0],
        ["released--", 0], // the run released the lock
        ["0000000045", 45], // a pid (a torn read of the marker never is)
        ["2147483648", 0], // over the largest pid
        [" 000012345", 0],
      ];
      for (const [value, child] of cases) {
        writeFileSync(
          path,
          `${deadPid()}\nrunlock 1\nhost=h\nchild=${value}\nmeta.cmd=x\n`,
        );
        const info = await inspect(path);
        assert.equal(info.state, "stale", value);
        assert.equal(info.child, child, value);
        assert.deepEqual(info.meta, { cmd: "x" }, value);
      }
    } finally {
      cleanup();
    }
  });
});
