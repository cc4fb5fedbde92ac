// Takeover is race-free: many processes released at the same instant at one
// stale file, many rounds, exactly one winner each round. The same harness
// run against the plain "read pid, remove, retry" pidfile (the control in
// fixtures/race.ts) must catch it electing two winners, which is what proves
// the harness can see the race at all.
import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { Child, deadPid, tempDir } from "../_helpers.ts";

const CONTENDERS = 6;

/**
 * The least time acquire backs off before it answers HeldError naming a
 * dead PID under a held flock: half of each attempt's back-off (50 us
 * doubling to 8 ms, times 0.5..1) over its 16 attempts: 38.4 ms (35 leaves
 * room for a sleep's rounding).
 */
const MIN_BACKOFF_MS = 35;

/** Runs `rounds` rounds; returns the number of winners in each. */
async function race(
  design: "runlock" | "naive",
  rounds: number,
  check: (
    winners: number,
    reports: Record<string, unknown>[],
    dead: number,
  ) => void,
): Promise<number[]> {
  const { dir, cleanup } = tempDir();
  const path = join(dir, "run.lock");
  const children = Array.from(
    { length: CONTENDERS },
    () => new Child("race.ts", [design, path]),
  );
  const counts: number[] = [];
  try {
    await Promise.all(children.map((c) => c.expect("ready")));
    for (let round = 0; round < rounds; round++) {
      const dead = deadPid();
      // A crashed holder's file: runlock's record, or a plain pidfile.
      writeFileSync(
        path,
        design === "runlock" ? `${dead}\nrunlock 1\nhost=gone\n` : `${dead}\n`,
      );
      // Every contender spins until the start file exists; it is made once
      // all of them say they are spinning.
      const start = join(dir, `start-${round}`);
      for (const c of children) c.send(`go ${start}`);
      await Promise.all(children.map((c) => c.expect("armed")));
      writeFileSync(start, "");
      const reports = await Promise.all(children.map((c) => c.next()));
      const winners = reports.filter((r) => r.event === "won");
      counts.push(winners.length);
      check(winners.length, reports, dead);
      for (const c of children) {
        if (reports[children.indexOf(c)].event === "won") {
          c.send("release");
          await c.expect("released");
        }
      }
    }
    return counts;
  } finally {
    await Promise.all(children.map((c) => c.kill()));
    cleanup();
  }
}

describe("stale takeover races", () => {
  test("many processes released at once at one stale file: exactly one winner each round", async () => {
    const rounds = Number(process.env.RUNLOCK_RACE_ROUNDS ?? 25);
    await race("runlock", rounds, (winners, reports, dead) => {
      assert.equal(winners, 1, JSON.stringify(reports));
      const winner = reports.find((r) => r.event === "won")!.pid;
      for (const r of reports) {
        assert.ok(r.event === "won" || r.event === "lost", JSON.stringify(r));
        if (r.event === "lost") {
          // The winner, or, when the winner was still inside its takeover
          // after the loser's last look (a loaded machine can pause it
          // that long), the crashed run the file still named, under the
          // winner's flock. Never anyone else; and the crashed run only
          // after backing off through every attempt, never at once: the
          // back-offs of acquire's attempts add up to at least 38 ms.
          assert.ok(
            r.holder === winner || r.holder === dead,
            `losers name the winner (${winner}) or the crashed run being taken over (${dead}): ${
              JSON.stringify(reports)
            }`,
          );
          if (r.holder === dead) {
            assert.ok(
              (r.ms as number) >= MIN_BACKOFF_MS,
              `a loser named the crashed run after ${r.ms} ms, without looking again`,
            );
          }
        }
      }
    });
  });

  test("control: the same harness catches the plain read-pid-remove-retry design electing two winners", async () => {
    // Until the first double win (a loaded machine may need more rounds
    // to interleave two contenders inside the window); bounded at 60
    // batches of 15 rounds, a hang detector.
    let doubled = false;
    for (let batch = 0; batch < 60 && !doubled; batch++) {
      const counts = await race("naive", 15, () => {});
      doubled = counts.some((n) => n > 1);
      console.log("naive winners per round", counts.join(","));
    }
    assert.ok(
      doubled,
      "the naive design should have elected two winners at least once",
    );
  });
});
