// What a run is, and where its PID lives: user fields (meta) in the record,
// and the holder's boot id and PID namespace, so that a prober can tell
// whether the recorded PID means the same process from where it asks.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  readdirSync,
  readFileSync,
  readlinkSync,
  writeFileSync,
} from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { acquire, acquireSync, inspect } from "../../mod.ts";
import {
  Child,
  countingTimers,
  deadPid,
  fixtureCommand,
  runtime,
  tempDir,
} from "../_helpers.ts";

/**
 * The sleeps a probe asks for while a dead PID of this namespace sits
 * under a held flock (flock(1) on a record naming a finished process): a
 * takeover in progress, waited out.
 */
async function takeoverSleeps(dir: string): Promise<number[]> {
  const path = join(dir, "takeover.lock");
  writeFileSync(path, `${deadPid()}\nrunlock 1\n`);
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
    const { result, timers } = await countingTimers(() => inspect(path));
    assert.equal(result.state, "held");
    assert.ok(timers.length > 0, "the probe looked again");
    return timers;
  } finally {
    tool.proc.stdin!.end();
    await tool.kill();
  }
}

const META = {
  cmd: "./sync.sh --full 'a b'",
  "job.id": "42",
  empty: "",
  utf: "héllo ✓ 日本",
  "a_b-c.d": "x=y=z",
};

describe("user fields (meta)", () => {
  test("round-trip: written as meta.<key>=<value> lines, read back by inspect() here and in another process, and on the lock", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      await using lock = await acquire(path, { meta: META });
      assert.deepEqual(lock.meta, META);
      assert.ok(Object.isFrozen(lock.meta));
      const text = readFileSync(path, "utf8");
      assert.match(text, /\nmeta\.cmd=\.\/sync\.sh --full 'a b'\n/);
      assert.match(text, /\nmeta\.job\.id=42\n/);
      assert.equal((await inspect(path)).meta.utf, META.utf);
      assert.deepEqual((await inspect(path)).meta, META);
      const seen = await new Child("child.ts", ["probe", path]).expect("probe");
      assert.deepEqual(seen.meta, META);
    } finally {
      cleanup();
    }
  });

  test("a holder in another process records its meta, and probes read it", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    const child = new Child("child.ts", [
      "hold",
      path,
      "0",
      JSON.stringify({ cmd: "migrate", by: "ci" }),
    ]);
    try {
      await child.expect("acquired");
      const info = await inspect(path);
      assert.equal(info.state, "held");
      assert.deepEqual(info.meta, { cmd: "migrate", by: "ci" });
      assert.equal(info.runtime, runtime);
    } finally {
      await child.kill();
      cleanup();
    }
  });

  test("a U+FFFD written in a field is read back as written; one byte that is not UTF-8 beside it makes the file invalid", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const good = join(dir, "good.lock");
      const text = "4242\nrunlock 1\nhost=h\uFFFDst\nmeta.note=a\uFFFDb\n";
      writeFileSync(good, text);
      const info = await inspect(good);
      assert.equal(info.state, "stale");
      assert.equal(info.host, "h\uFFFDst");
      assert.deepEqual(info.meta, { note: "a\uFFFDb" });
      const bad = join(dir, "bad.lock");
      const bytes = new TextEncoder().encode(text);
      bytes[bytes.length - 2] = 0xff;
      writeFileSync(bad, bytes);
      const refused = await inspect(bad);
      assert.equal(refused.state, "invalid");
      assert.match(refused.reason ?? "", /not UTF-8 text/);
    } finally {
      cleanup();
    }
  });

  test("a record without fields (foreign, older runlock, or none given) has meta {}; unknown and malformed keys are ignored", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const cases: [string, string][] = [
        ["plain.pid", "4242\n"],
        [
          "old.lock",
          "4242\nrunlock 1\nhost=build-7\nstarted=2026-11-30T09:52:11.000Z\n",
        ],
        [
          "odd.lock",
          "4242\nrunlock 1\nmeta.Bad=x\nmeta.=y\nmetacmd=z\nfuture=1\n",
        ],
      ];
      for (const [name, content] of cases) {
        writeFileSync(join(dir, name), content);
        assert.deepEqual((await inspect(join(dir, name))).meta, {}, name);
      }
      await using lock = await acquire(join(dir, "none.lock"));
      assert.deepEqual(lock.meta, {});
      assert.deepEqual((await inspect(lock.path)).meta, {});
    } finally {
      cleanup();
    }
  });

  const bad: [string, unknown, typeof TypeError | typeof RangeError, RegExp][] =
    [
      ["an array", ["x"], TypeError, /'meta' must be a plain object/],
      ["a string", "cmd=x", TypeError, /'meta' must be a plain object/],
      ["null", null, TypeError, /'meta' must be a plain object/],
      [
        "a Map",
        new Map([["cmd", "x"]]),
        TypeError,
        /'meta' must be a plain object/,
      ],
      [
        "an uppercase key",
        { Cmd: "x" },
        RangeError,
        /the meta key "Cmd" must match/,
      ],
      ["an empty key", { "": "x" }, RangeError, /the meta key "" must match/],
      [
        "a key with a space",
        { "my key": "x" },
        RangeError,
        /the meta key "my key"/,
      ],
      ["a key with =", { "a=b": "x" }, RangeError, /the meta key "a=b"/],
      [
        "a 65-character key",
        { ["k".repeat(65)]: "x" },
        RangeError,
        /must match \[a-z0-9_\.-\]\{1,64\}/,
      ],
      [
        "a number value",
        { pid: 42 },
        TypeError,
        /meta\.pid must be a string: current value is number/,
      ],
      [
        "a value with a newline",
        { cmd: "a\nb" },
        RangeError,
        /meta\.cmd must be one line/,
      ],
      [
        "a value with CR",
        { cmd: "a\rb" },
        RangeError,
        /meta\.cmd must be one line/,
      ],
      [
        "a value with NUL",
        { cmd: "a\0b" },
        RangeError,
        /meta\.cmd must be one line without NUL/,
      ],
      [
        "a lone surrogate",
        { cmd: "a\uD800b" },
        RangeError,
        /meta\.cmd is not valid UTF-8/,
      ],
      [
        "a value with U+2028",
        { cmd: "a\u2028host=evil" },
        RangeError,
        /meta\.cmd must be one line/,
      ],
      [
        "a value with NEL (U+0085)",
        { cmd: "a\u0085b" },
        RangeError,
        /meta\.cmd must be one line/,
      ],
      [
        "a value with a vertical tab",
        { cmd: "a\vb" },
        RangeError,
        /meta\.cmd must be one line/,
      ],
      [
        "a value with a form feed",
        { cmd: "a\fb" },
        RangeError,
        /meta\.cmd must be one line/,
      ],
      [
        "the key __proto__",
        JSON.parse('{"__proto__": "x"}'),
        RangeError,
        /the meta key "__proto__" must match/,
      ],
      [
        "a record over 4 KiB",
        { cmd: "x".repeat(4000), note: "y".repeat(200) },
        RangeError,
        /over 4096 \(runlock's own lines take \d+\): shorten meta\.cmd by \d+ bytes/,
      ],
    ];
  for (const [name, meta, type, message] of bad) {
    test(`meta with ${name} is a ${type.name} naming the key, before anything touches the disk`, async () => {
      const { dir, cleanup } = tempDir();
      try {
        const path = join(dir, "state", "run.lock");
        const check = (err: unknown) => {
          assert.ok(err instanceof type, String(err));
          assert.match((err as Error).message, message);
          return true;
        };
        // deno-lint-ignore no-explicit-any
        await assert.rejects(acquire(path, { meta: meta as any }), check);
        // deno-lint-ignore no-explicit-any
        assert.throws(() => acquireSync(path, { meta: meta as any }), check);
        assert.deepEqual(readdirSync(dir), [], "not even the directory");
      } finally {
        cleanup();
      }
    });
  }

  test("a record just under 4 KiB is written and read back whole", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      const big = "z".repeat(3500);
      await using _lock = await acquire(path, { meta: { big } });
      assert.ok(readFileSync(path).length <= 4096);
      assert.equal((await inspect(path)).meta.big, big);
    } finally {
      cleanup();
    }
  });
});

/** This machine's boot id and this process's PID namespace inode. */
function here(): { boot: string; pidns: string } {
  return {
    boot: readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim(),
    pidns: /\[(\d+)\]/.exec(readlinkSync("/proc/self/ns/pid"))![1],
  };
}

describe("where the PID lives", () => {
  test("the record names the holder's boot id and PID namespace, and inspect() says its pid is valid here", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      await using _lock = await acquire(path);
      const { boot, pidns } = here();
      const text = readFileSync(path, "utf8");
      assert.match(text, new RegExp(`\\nboot=${boot}\\n`));
      assert.match(text, new RegExp(`\\npidns=${pidns}\\n`));
      const info = await inspect(path);
      assert.equal(info.bootId, boot);
      assert.equal(info.pidNamespace, pidns);
      assert.equal(info.pidValidHere, true);
      assert.equal(info.pidElsewhere, undefined);
    } finally {
      cleanup();
    }
  });

  test("a live holder's record from another boot, another host, another PID namespace, or one that does not say: false with the reason, or unknown; a container's own host name alone does not make it false", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const { boot, pidns } = here();
      const host = hostname();
      // Each record held under a flock (flock(1) stands for its holder):
      // only a live holder's PID says anything.
      const cases: [string, string, boolean | undefined, string | undefined][] =
        [
          [
            "other-boot",
            `4242\nrunlock 1\nhost=${host}\nboot=00000000-0000-0000-0000-000000000000\npidns=${pidns}\n`,
            false,
            "boot",
          ],
          ["other-host", `4242\nrunlock 1\nhost=not-${host}\n`, false, "host"],
          // A container of its own name (UTS namespace) on this kernel, in
          // this PID namespace: the PID is valid here, whatever the name.
          [
            "own-name",
            `4242\nrunlock 1\nhost=not-${host}\nboot=${boot}\npidns=${pidns}\n`,
            true,
            undefined,
          ],
          [
            "other-ns",
            `4242\nrunlock 1\nhost=${host}\nboot=${boot}\npidns=1\n`,
            false,
            "namespace",
          ],
          ["old", `4242\nrunlock 1\nhost=${host}\n`, undefined, undefined],
          ["foreign", `4242\n`, undefined, undefined],
        ];
      for (const [name, content, valid, elsewhere] of cases) {
        const path = join(dir, name);
        writeFileSync(path, content);
        // -o: flock(1) itself holds the lock (its command does not), so
        // killing it frees the lock at once.
        const tool = new Child("", [], undefined, [
          "flock",
          "-o",
          "-x",
          path,
          "sh",
          "-c",
          "echo locked; read _",
        ]);
        try {
          assert.equal((await tool.next()).text, "locked");
          const info = await inspect(path);
          assert.equal(info.state, "held", name);
          assert.equal(info.pidValidHere, valid, name);
          assert.equal(info.pidElsewhere, elsewhere, name);
        } finally {
          // Its command ends when our end of its stdin closes, and flock(1)
          // with it.
          tool.proc.stdin!.end();
          await tool.kill();
        }
        // Not held, the PID says nothing: its namespace may be gone, and
        // its inode number reused.
        assert.equal((await inspect(path)).pidValidHere, undefined, name);
      }
    } finally {
      cleanup();
    }
  });

  const canUnshare =
    spawnSync("unshare", ["--pid", "--fork", "--kill-child", "true"]).status ===
      0;
  test(
    "a holder in its own PID namespace sharing the lock directory: held, and its pid is not valid here (another namespace)",
    {
      skip: !canUnshare &&
        "unshare --pid needs root and a kernel that allows it",
    },
    async () => {
      const { dir, cleanup } = tempDir();
      const path = join(dir, "run.lock");
      const [cmd, args] = fixtureCommand("child.ts", ["hold", path]);
      const child = new Child("", [], undefined, [
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        cmd,
        ...args,
      ]);
      try {
        const held = await child.expect("acquired");
        assert.equal(held.pid, 1, "PID 1 inside its namespace");
        // Its PID is dead from here, under a held flock: that is not a
        // takeover in progress (which probes wait out), since the PID lives
        // in another namespace: the probe looks again only as long as a
        // takeover takes. The sleeps it asks for are counted (not the time
        // it took), against a probe of a dead PID of this namespace under a
        // held flock, which waits out a takeover.
        const { result: info, timers } = await countingTimers(() =>
          inspect(path)
        );
        const waitedOut = await takeoverSleeps(dir);
        const sum = (ms: number[]) => ms.reduce((a, b) => a + b, 0);
        assert.ok(
          sum(timers) < sum(waitedOut),
          `slept ${timers.join("+")} ms; a takeover is waited out with ${
            waitedOut.join("+")
          } ms`,
        );
        assert.equal(info.state, "held");
        assert.equal(info.pid, 1);
        assert.equal(info.pidValidHere, false);
        assert.equal(info.pidElsewhere, "namespace");
        assert.notEqual(info.pidNamespace, here().pidns);
      } finally {
        await child.kill();
        cleanup();
      }
    },
  );
});
