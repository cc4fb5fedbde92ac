// scan(): every runlock lock under a directory, found by its record, sorted
// by path, without taking a lock or writing anything.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { type AddressInfo, connect, createServer, type Socket } from "node:net";
import { join } from "node:path";
import { describe, test } from "node:test";
import { acquire, RunlockError, scan } from "../../mod.ts";
import { Child, deadPid, tempDir } from "../_helpers.ts";

/** Every file under `dir` with its inode, mtime and content. */
function snapshot(dir: string): string {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const name of readdirSync(d).sort()) {
      const path = join(d, name);
      const s = lstatSync(path);
      const content = s.isFile() ? readFileSync(path, "latin1") : "";
      out.push(JSON.stringify([path, s.ino, s.mtimeMs, s.mode, content]));
      if (s.isDirectory()) walk(path);
    }
  };
  walk(dir);
  return out.join("\n");
}

/**
 * Files in a big scan: enough that a scan outlasts its 10 ms between turns
 * of the event loop several times over. By hand, warm, 12,000 records take
 * 52-57 ms on Node and Bun; half as many take 26-33 ms on Node, near enough
 * to 10 ms for a faster machine to reach.
 */
const BIG = 12_000;

describe("scan()", () => {
  test("lists every runlock lock (held and stale, any file name), sorted by path, and nothing else, without writing", async () => {
    const { dir, cleanup } = tempDir();
    // A live holder that keeps no watch: a runlock process's own watch
    // makes and removes a marker file beside its lock once it starts, which
    // a busy machine can leave between the two snapshots.
    const live = new Child("", [join(dir, "b-live.lock")], undefined, [
      "python3",
      new URL("../fixtures/record_holder.py", import.meta.url).pathname,
    ]);
    try {
      assert.equal((await live.next()).text, "held");
      const dead = deadPid();
      writeFileSync(join(dir, "a-crashed"), `${dead}\nrunlock 1\nhost=x\n`);
      writeFileSync(join(dir, "plain.pid"), `${dead}\n`); // a plain pidfile
      writeFileSync(join(dir, "notes.txt"), "hello\n");
      writeFileSync(join(dir, "empty"), "");
      writeFileSync(
        join(dir, ".b-live.lock.0123456789abcdef.tmp"),
        `${dead}\nrunlock 1\n`,
      ); // litter of a dead acquire
      symlinkSync(join(dir, "a-crashed"), join(dir, "link.lock"));
      assert.equal(spawnSync("mkfifo", [join(dir, "fifo.lock")]).status, 0);
      mkdirSync(join(dir, "sub"));
      writeFileSync(join(dir, "sub", "deep.lock"), `${dead}\nrunlock 1\n`);
      const before = snapshot(dir);

      const found = await scan(dir);
      assert.deepEqual(found.map((i) => [i.path, i.state, i.pid]), [
        [join(dir, "a-crashed"), "stale", dead],
        [join(dir, "b-live.lock"), "held", live.pid],
      ]);
      assert.equal(found[0].host, "x");

      const deep = await scan(dir, { recursive: true });
      assert.deepEqual(deep.map((i) => i.path), [
        join(dir, "a-crashed"),
        join(dir, "b-live.lock"),
        join(dir, "sub", "deep.lock"),
      ]);
      assert.equal(snapshot(dir), before, "nothing was written or removed");
    } finally {
      await live.kill();
      cleanup();
    }
  });

  test("a missing directory has no locks; a bad argument is a TypeError; an aborted signal rejects with its reason", async () => {
    const { dir, cleanup } = tempDir();
    try {
      assert.deepEqual(await scan(join(dir, "nowhere")), []);
      await assert.rejects(scan(""), TypeError);
      await using _lock = await acquire(join(dir, "x.lock"));
      const reason = new Error("stop");
      await assert.rejects(
        scan(dir, { signal: AbortSignal.abort(reason) }),
        (err) => err === reason,
      );
    } finally {
      cleanup();
    }
  });

  test("meta and runtime come back for each lock, as from inspect()", async () => {
    const { dir, cleanup } = tempDir();
    try {
      await using _a = await acquire(join(dir, "sync.lock"), {
        meta: { cmd: "sync --full" },
      });
      const [found] = await scan(dir);
      assert.equal(found.state, "held");
      assert.deepEqual(found.meta, { cmd: "sync --full" });
      assert.notEqual(found.runtime, "");
    } finally {
      cleanup();
    }
  });

  test("a file given as the directory is a RunlockError, not a TypeError", async () => {
    const { dir, cleanup } = tempDir();
    try {
      writeFileSync(join(dir, "file"), "x");
      await assert.rejects(scan(join(dir, "file")), (err) => {
        assert.ok(err instanceof RunlockError, String(err));
        assert.ok(!(err instanceof TypeError));
        assert.match(err.message, /not a directory/);
        return true;
      });
    } finally {
      cleanup();
    }
  });

  test("a big scan lets timers run, so its signal can stop it", async () => {
    const { dir, cleanup } = tempDir();
    try {
      for (let i = 0; i < BIG; i++) {
        writeFileSync(join(dir, `job-${i}.lock`), `${i + 1}\nrunlock 1\n`);
      }
      let ticks = 0;
      const timer = setInterval(() => ticks++, 1);
      try {
        assert.equal((await scan(dir)).length, BIG);
      } finally {
        clearInterval(timer);
      }
      assert.ok(ticks > 0, "a 1 ms interval ran during the scan");
      const controller = new AbortController();
      setTimeout(() => controller.abort(new Error("enough")), 1);
      await assert.rejects(
        scan(dir, { signal: controller.signal }),
        /enough/,
      );
    } finally {
      cleanup();
    }
  });

  test("a big scan lets I/O through: a socket's data arrive during it", async () => {
    const { dir, cleanup } = tempDir();
    const server = createServer();
    let client: Socket | undefined;
    try {
      for (let i = 0; i < BIG; i++) {
        writeFileSync(join(dir, `job-${i}.lock`), `${i + 1}\nrunlock 1\n`);
      }
      let received = 0;
      const accepted = new Promise<void>((resolve) =>
        server.on("connection", (socket) => {
          socket.on("data", () => received++);
          resolve();
        })
      );
      await new Promise<void>((resolve) =>
        server.listen(0, "127.0.0.1", resolve)
      );
      const { port } = server.address() as AddressInfo;
      client = connect(port, "127.0.0.1");
      await accepted;
      const writer = setInterval(() => client!.write("x"), 1);
      let during: number;
      try {
        received = 0;
        assert.equal((await scan(dir)).length, BIG);
        during = received;
      } finally {
        clearInterval(writer);
      }
      assert.ok(
        during > 0,
        "the server read the client's bytes during the scan",
      );
    } finally {
      client?.destroy();
      await new Promise((resolve) => server.close(resolve));
      cleanup();
    }
  });
});
