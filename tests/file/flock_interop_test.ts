// runlock's lock is a real flock(2): flock(1) and Python's fcntl.flock see
// it, and a flock(1) holder excludes runlock.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { describe, test } from "node:test";
import { acquire, activePid, held, HeldError, inspect } from "../../mod.ts";
import { Child, holder, run, tempDir } from "../_helpers.ts";

const python = spawnSync("python3", ["--version"]).status === 0;

describe("flock interop", () => {
  test("while runlock holds the file, flock -n (exclusive and shared) fails", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const first = await holder(path);
    try {
      assert.equal(run("flock", ["-n", path, "true"]), 1);
      assert.equal(run("flock", ["-n", "-s", path, "true"]), 1);
      first.send("release");
      await first.expect("released");
      assert.equal(run("flock", ["-n", path, "true"]), 0);
    } finally {
      await first.kill();
      cleanup();
    }
  });

  test(
    "Python's fcntl.flock sees a runlock holder",
    { skip: !python },
    async () => {
      const { dir, cleanup } = tempDir();
      const path = join(dir, "run.lock");
      const first = await holder(path);
      try {
        const code = [
          "import fcntl, sys",
          "f = open(sys.argv[1])",
          "try:",
          "    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)",
          "except BlockingIOError:",
          "    sys.exit(7)",
        ].join("\n");
        assert.equal(run("python3", ["-c", code, path]), 7);
      } finally {
        await first.kill();
        cleanup();
      }
    },
  );

  test("flock(1) holding the file excludes runlock, and probes report it held", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    // flock(1) creates the file empty and holds it: no pid to name. Its
    // command says when flock holds it, and ends (and flock with it) when
    // our end of its stdin closes.
    const tool = new Child("", [], undefined, [
      "flock",
      path,
      "sh",
      "-c",
      "echo locked; read _; exit 0",
    ]);
    try {
      assert.equal((await tool.next()).text, "locked");
      assert.equal(await held(path), true);
      assert.equal((await inspect(path)).state, "held");
      assert.deepEqual(await activePid(path), { pid: 0, alive: true });
      await assert.rejects(acquire(path), (err) => {
        assert.ok(err instanceof HeldError);
        assert.equal(err.pid, 0);
        assert.match(err.message, /the file names no pid/);
        return true;
      });
      tool.proc.stdin!.end();
      assert.equal(((await tool.exited) as { code: number }).code, 0);
    } finally {
      await tool.kill();
      cleanup();
    }
  });

  test("flock(1) holding a pidfile it wrote excludes runlock, which names that pid", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    try {
      // A script in the style of `exec 9>f; flock -n 9; echo $$ >&9`; it
      // says when it holds the lock, and holds it until killed.
      const script = new Child("", [], undefined, [
        "sh",
        "-c",
        'exec 9>"$1"; flock -n 9 || exit 1; echo $$ >&9; echo locked; exec sleep 300',
        "sh",
        path,
      ]);
      assert.equal((await script.next()).text, "locked");
      assert.equal(await held(path), true);
      await assert.rejects(acquire(path), (err) => {
        assert.ok(err instanceof HeldError);
        assert.equal(err.pid, script.pid);
        return true;
      });
      await script.kill("SIGKILL");
      const lock = await acquire(path); // its pid is dead and its flock gone
      await lock.release();
    } finally {
      cleanup();
    }
  });
});
