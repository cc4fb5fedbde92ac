// Property tests (fast-check) of the record's writer and reader, through
// the public API only: what acquire writes, inspect reads back; whatever
// bytes sit in the file, inspect and acquire answer with a state or a
// typed error and never a PID outside 1..2^31-1; and no reader reads past
// 4 KiB (a 1 TiB sparse file is judged at once, and strace, where it can
// trace, counts the bytes read). FC_SEED=<n> replays a run.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  closeSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  truncateSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { hostname } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { after, describe, test } from "node:test";
import fc from "npm:fast-check@4.11.0";
import {
  acquire,
  HeldError,
  inspect,
  InvalidLockFileError,
  type Meta,
} from "../../mod.ts";
import { deadPid, fixtureCommand, runtime, tempDir } from "../_helpers.ts";

const MAX_PID = 2 ** 31 - 1;
const seed = process.env.FC_SEED ? Number(process.env.FC_SEED) : undefined;
const runs = (numRuns: number) => ({ numRuns, seed });

const { dir, cleanup } = tempDir();
after(cleanup);
let counter = 0;
/** A fresh lock path for one run of a property. */
const freshPath = () => join(dir, `p${counter++}.lock`);

// A meta key as the protocol allows it ("__proto__" matches the pattern
// but is refused: as a key of a plain object it would set the prototype).
const metaKey = fc.stringMatching(/^[a-z0-9_.-]{1,64}$/)
  .filter((k) => k !== "__proto__");
// What a value may not hold (the meta option's documented rule): anything a
// reader could take for a line end, and every control character but tab.
// deno-lint-ignore no-control-regex -- matching control characters is the point
const BAD = /[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029]/;
// One line of text: any Unicode (whole graphemes) but those.
const metaValue = fc.string({ unit: "grapheme", maxLength: 60 })
  .filter((v) => !BAD.test(v));
const meta = fc.dictionary(metaKey, metaValue, {
  maxKeys: 12,
  noNullPrototype: true,
});
// Values that may hold a forbidden character somewhere.
const anyValue = fc.oneof(
  metaValue,
  fc.tuple(
    metaValue,
    fc.constantFrom(
      "\n",
      "\r",
      "\0",
      "\x0b",
      "\x0c",
      "\x1b",
      "\x7f",
      "\x85",
      "\u2028",
      "\u2029",
    ),
    metaValue,
  ).map(([a, bad, b]) => a + bad + b),
);
const anyMeta = fc.dictionary(metaKey, anyValue, {
  maxKeys: 6,
  noNullPrototype: true,
});
const pid = fc.integer({ min: 1, max: MAX_PID });
const host = fc.string({ unit: "grapheme-ascii", maxLength: 40 })
  .filter((h) => !/[\r\n]/.test(h));
const started = fc.date({
  min: new Date("1970-01-01T00:00:00.000Z"),
  max: new Date("9999-12-31T23:59:59.999Z"),
  noInvalidDate: true,
});

describe(`record properties (${runtime})`, () => {
  test("round trip: every valid meta acquire writes, inspect reads back exactly; a value with a line end or control character is a RangeError", async () => {
    await fc.assert(
      fc.asyncProperty(anyMeta, async (m: Meta) => {
        const path = freshPath();
        const bad = Object.values(m).some((v) => BAD.test(v));
        let lock;
        try {
          lock = await acquire(path, { meta: m });
        } catch (err) {
          assert.ok(err instanceof RangeError, String(err));
          if (bad) {
            assert.match(err.message, /must be one line without NUL/);
          } else {
            // The only refusal of valid fields: a record over 4 KiB.
            assert.match(
              err.message,
              /over 4096 \(runlock's own lines take \d+\): shorten (meta\.[^ ]+|the meta) by \d+ bytes?/,
            );
          }
          assert.deepEqual(readdirSync(dir), []);
          return;
        }
        try {
          assert.ok(!bad, `accepted ${JSON.stringify(m)}`);
          const info = await inspect(path);
          assert.equal(info.state, "held");
          assert.equal(info.pid, process.pid);
          assert.equal(info.host, hostname());
          assert.deepEqual(info.meta, m);
          assert.deepEqual(lock.meta, m);
          assert.equal(info.started?.getTime(), lock.acquiredAt.getTime());
        } finally {
          await lock.release();
        }
      }),
      runs(200),
    );
    assert.deepEqual(readdirSync(dir), []);
  });

  test("round trip: every valid record written by hand (fields in any order, unknown keys, CRLF) reads back exactly", async () => {
    const record = fc.record({
      pid,
      host: fc.option(host, { nil: undefined }),
      started: fc.option(started, { nil: undefined }),
      runtime: fc.option(fc.constantFrom("deno", "node", "bun", "x"), {
        nil: undefined,
      }),
      meta,
      unknown: fc.array(
        fc.tuple(fc.stringMatching(/^[a-z]{1,8}$/), metaValue),
        { maxLength: 3 },
      ),
      crlf: fc.boolean(),
      order: fc.func(fc.integer()),
    });
    await fc.assert(
      fc.asyncProperty(record, async (r) => {
        const lines: string[] = [];
        if (r.host !== undefined) lines.push(`host=${r.host}`);
        if (r.started) lines.push(`started=${r.started.toISOString()}`);
        if (r.runtime) lines.push(`runtime=${r.runtime}`);
        for (const [k, v] of Object.entries(r.meta)) {
          lines.push(`meta.${k}=${v}`);
        }
        for (const [k, v] of r.unknown) {
          if (!["host", "started", "runtime", "boot", "pidns"].includes(k)) {
            lines.push(`${k}=${v}`);
          }
        }
        // Any order of the key=value lines (keys are distinct).
        lines.sort((a, b) => r.order(a) - r.order(b));
        const eol = r.crlf ? "\r\n" : "\n";
        const text = [String(r.pid), "runlock 1", ...lines].join(eol) + eol;
        if (new TextEncoder().encode(text).length > 4096) return;
        const path = freshPath();
        writeFileSync(path, text);
        try {
          const info = await inspect(path);
          // Nobody holds its flock: a dead run's record, whatever its pid.
          assert.equal(info.state, "stale");
          assert.equal(info.pid, r.pid);
          assert.equal(info.host, r.host ?? "");
          assert.equal(info.started?.getTime(), r.started?.getTime());
          assert.equal(info.runtime, r.runtime ?? "");
          assert.deepEqual(info.meta, r.meta);
          assert.equal(info.foreign, false);
        } finally {
          rmSync(path);
        }
      }),
      runs(300),
    );
  });

  test("arbitrary bytes: inspect answers a state, acquire takes it or throws InvalidLockFileError or HeldError; never another error, never a PID outside 1..2^31-1", async () => {
    const pidLike = fc.oneof(
      fc.integer({ min: -5, max: 2 ** 33 }).map(String),
      fc.stringMatching(/^[-+ 0x]{0,2}[0-9]{1,12}[ \r]?$/),
      fc.constant(String(deadPid())),
    );
    const bytes = fc.oneof(
      fc.uint8Array({ maxLength: 80 }),
      // Near-records: a pid-like first line, then marker-like and
      // key=value-like lines, with stray bytes.
      fc.tuple(
        pidLike,
        fc.constantFrom("runlock 1", "runlock 2", "runlock", "Runlock 1", ""),
        fc.array(fc.string({ unit: "binary", maxLength: 20 }), {
          maxLength: 4,
        }),
        fc.constantFrom("\n", "\r\n", "\0", ""),
      ).map(([p, m, rest, eol]) =>
        new TextEncoder().encode([p, m, ...rest].join(eol))
      ),
    );
    await fc.assert(
      fc.asyncProperty(bytes, async (b) => {
        const path = freshPath();
        writeFileSync(path, b);
        try {
          const info = await inspect(path);
          assert.ok(
            ["stale", "held", "invalid"].includes(info.state),
            info.state,
          );
          assert.ok(Number.isInteger(info.pid));
          assert.ok(
            info.pid === 0 || (info.pid >= 1 && info.pid <= MAX_PID),
            `pid ${info.pid}`,
          );
          if (info.state === "invalid") {
            assert.equal(info.pid, 0);
            assert.equal(typeof info.reason, "string");
          }
          try {
            const lock = await acquire(path);
            assert.equal(info.state, "stale", "only a stale file is taken");
            await lock.release();
          } catch (err) {
            if (err instanceof InvalidLockFileError) {
              assert.equal(info.state, "invalid");
              assert.equal(err.path, path);
            } else if (err instanceof HeldError) {
              // A foreign pidfile naming a live process.
              assert.equal(info.state, "held");
              assert.equal(err.pid, info.pid);
              assert.ok(err.pid >= 1 && err.pid <= MAX_PID);
            } else {
              throw err;
            }
          }
        } finally {
          rmSync(path, { force: true });
        }
      }),
      runs(400),
    );
  });

  test("a first line is a PID exactly when it is 1..2147483647 in plain decimal; anything else is invalid with pid 0", async () => {
    const line = fc.oneof(
      fc.bigInt({ min: -(2n ** 40n), max: 2n ** 40n }).map(String),
      fc.stringMatching(/^[+-]?0*[0-9]{1,11}$/),
      fc.string({ unit: "grapheme-ascii", maxLength: 12 })
        .filter((s) => !/[\r\n]/.test(s)),
    );
    await fc.assert(
      fc.asyncProperty(line, async (first) => {
        const path = freshPath();
        writeFileSync(path, `${first}\nrunlock 1\n`);
        try {
          const info = await inspect(path);
          const valid = /^[1-9][0-9]*$/.test(first) &&
            BigInt(first) <= BigInt(MAX_PID);
          if (valid) {
            assert.equal(info.state, "stale");
            assert.equal(info.pid, Number(first));
          } else {
            assert.equal(info.state, "invalid", first);
            assert.equal(info.pid, 0);
          }
        } finally {
          rmSync(path);
        }
      }),
      runs(400),
    );
  });

  test("no reader reads past 4 KiB: a sparse file of up to 1 TiB behind a valid record is refused as larger than 4096 bytes (the time printed; strace counts the bytes below), and a record of exactly 4096 bytes is read", async () => {
    let slowest = 0;
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 4097, max: 2 ** 40 }),
        async (size) => {
          const path = freshPath();
          writeFileSync(path, `${deadPid()}\nrunlock 1\n`);
          truncateSync(path, size);
          try {
            const t0 = performance.now();
            const info = await inspect(path);
            assert.equal(info.state, "invalid");
            assert.match(info.reason ?? "", /larger than 4096 bytes/);
            await assert.rejects(acquire(path), InvalidLockFileError);
            slowest = Math.max(slowest, performance.now() - t0);
          } finally {
            rmSync(path);
          }
        },
      ),
      runs(20),
    );
    console.log(
      `slowest refusal of a large sparse file: ${slowest.toFixed(1)} ms`,
    );
    const path = freshPath();
    const head = `${deadPid()}\nrunlock 1\nhost=`;
    writeFileSync(path, head + "h".repeat(4096 - head.length - 1) + "\n");
    assert.equal((await inspect(path)).state, "stale");
    rmSync(path);
  });

  test("no reader reads past 4 KiB: strace counts at most 4097 bytes read from a large lock file by a probe and by an acquire", async (t) => {
    const can = spawnSync("strace", ["-qq", "-o", "/dev/null", "true"]);
    if (can.error || can.status !== 0) {
      return t.skip?.(
        "strace cannot trace here (file/injected_errors_test says why)",
      );
    }
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 4097, max: 64 * 1024 * 1024 }),
        fc.constantFrom("probe", "acquire"),
        (size, mode) => {
          const path = freshPath();
          const fd = openSync(path, "w");
          writeSync(fd, `${deadPid()}\nrunlock 1\n`);
          closeSync(fd);
          truncateSync(path, size);
          const trace = join(dir, "read.trace");
          try {
            const [cmd, args] = fixtureCommand("inject_fixture.ts", [
              mode,
              path,
            ]);
            const r = spawnSync("strace", [
              "-qq",
              "-y",
              "-e",
              "trace=read,pread64,readv,preadv,preadv2",
              "-o",
              trace,
              cmd,
              ...args,
            ], { encoding: "utf8" });
            assert.match(r.stdout, mode === "probe" ? /invalid/ : /"ok":false/);
            let total = 0;
            const mine = new RegExp(`^\\w+\\(\\d+<${path}>.* = (\\d+)$`);
            for (const line of readFileSync(trace, "utf8").split("\n")) {
              const m = mine.exec(line);
              if (m) total += Number(m[1]);
            }
            assert.ok(total > 0, "the file was read");
            assert.ok(total <= 4097, `${total} bytes read of ${size}`);
          } finally {
            rmSync(path);
            rmSync(trace, { force: true });
          }
        },
      ),
      runs(6),
    );
  });
});
