// The PostgreSQL chaos run's checker (tests/fixtures/chaos_check.ts), on
// logs written by hand: a fault's window is what excuses a loss, so a
// window too short makes the chaos test fail on a fault that did happen.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { check } from "../fixtures/chaos_check.ts";

/** A log of `events` (each with its worker's fields), one second apart. */
function log(events: Record<string, unknown>[]): string {
  return events.map((e, i) => JSON.stringify({ t: 1_000_000 + i * 1000, ...e }))
    .join("\n") + "\n";
}

/** The lines of worker w's acquisition n of `name`, with fence n. */
function cycle(w: string, n: number, name = "chaos/0") {
  const acq = `${w}.${n}`;
  const fence = String(n);
  return {
    acquiring: { ev: "acquiring", w, acq, name, timeout: 30_000 },
    acquired: { ev: "acquired", w, acq, name, fence, timeout: 30_000 },
    leave: { ev: "leave", w, acq, name, fence },
    released: { ev: "released", w, acq, name, fence },
    lost: {
      ev: "lost",
      w,
      acq,
      name,
      fence,
      what:
        "ended: terminating connection due to administrator command (57P01)",
    },
  };
}

describe("the chaos run's checker", () => {
  test("a pg_terminate_backend lasts until psql returns: a worker that released and took the lock twice more before the session ended reports a loss the terminate explains, not a loss no fault explains", () => {
    const w = "deno-0.0";
    const [a, b, c] = [1, 2, 3].map((n) => cycle(w, n));
    const text = log([
      a.acquiring,
      a.acquired,
      // The injector saw w holding on backend 4242 and started psql.
      { ev: "terminate", w, backend: 4242, name: "chaos/0" },
      a.leave,
      a.released,
      b.acquiring,
      b.acquired,
      b.leave,
      b.released,
      c.acquiring,
      c.acquired,
      c.lost, // psql's pg_terminate_backend ran only now
      { ev: "terminated", w },
      { ...c.released, lost: true },
    ]);
    const report = check(text, { heartbeatTimeout: 3000 });
    assert.deepEqual(report.violations, []);
    assert.equal(report.lossesByCause.terminate, 1);
  });

  test("a loss with no fault of its worker in its window is still a violation: the terminate of another worker does not explain it", () => {
    const w = "deno-0.0";
    const [a, b] = [1, 2].map((n) => cycle(w, n));
    const text = log([
      a.acquiring,
      a.acquired,
      { ev: "terminate", w: "deno-1.0", backend: 4242, name: "chaos/1" },
      { ev: "terminated", w: "deno-1.0" },
      a.leave,
      a.released,
      b.acquiring,
      b.acquired,
      b.lost,
      { ...b.released, lost: true },
    ]);
    const report = check(text, { heartbeatTimeout: 3000 });
    assert.deepEqual(report.violations.map((v) => v.rule), ["loss"]);
  });
});
