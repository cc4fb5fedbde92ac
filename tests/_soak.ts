// The soak (scripts/soak.ts for the long run, tests/file/soak_test.ts for CI's
// short one): workers of one or more runtimes loop acquire/release on a few
// locks (fixtures/soak_worker.ts) while a killer SIGKILLs holders,
// SIGSTOPs and SIGCONTs workers, and deletes lock files by hand. Mutual
// exclusion is checked afterwards from the append-only log the workers and
// the killer share.
//
// The rules the log must obey, per lock:
// - a worker enters only when nobody is inside, or when whoever is inside
//   was SIGKILLed before (the kernel dropped its flock);
// - the one exception is a deletion of the lock file by the killer (done
//   while the holder is SIGSTOPped, so that the log can say whose file it
//   was): then another worker may enter while that holder is still inside,
//   and the holder must report the loss (lock.signal, or release() throwing
//   LockLostError). Every overlap must be explained by such a reported loss
//   (or by a holder SIGKILLed before it could report), and every reported
//   loss by a deletion: of that holder's own file, or one made while
//   another holder of the same lock whose file was deleted had not finished
//   its release. (That second kind is real: a holder paused between the
//   lstat and the unlink of its release, whose file someone deletes in that
//   window, unlinks its successor's file when it goes on; the successor
//   reports the loss. Counted apart as "cascade" losses.) Never a silent
//   overlap, never a loss without a deletion before it;
// - no worker reports any other error;
// - after the run, one clean acquire and release of each lock in a fresh
//   process leaves the directory empty.
import { spawnSync } from "node:child_process";
import {
  appendFileSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { basename, dirname, join } from "node:path";
import { Child, delay, fixtureCommand } from "./_helpers.ts";

/** What one soak run did and found. */
export interface SoakReport {
  seconds: number;
  runtimes: string[];
  locks: number;
  workers: number;
  /** Worker processes started in all (the killer's victims are replaced). */
  processes: number;
  acquisitions: number;
  acquisitionsByRuntime: Record<string, number>;
  kills: number;
  /** Kills of a worker that was inside its critical section. */
  killsInside: number;
  stops: number;
  /** Lock files deleted by hand, each while its holder was stopped. */
  deletions: number;
  /**
   * Of those, the ones whose directory was moved away and made anew
   * (`mv d d.old && mkdir d`, with `moves`): the file left the path.
   */
  moves: number;
  overlaps: number;
  /** Overlaps whose holder reported the loss (lock.signal / release). */
  overlapsReported: number;
  /** Overlaps after a deletion whose holder was SIGKILLed before it could report. */
  overlapsHolderKilled: number;
  /** Overlaps that no deletion explains: must be 0. */
  overlapsUnexplained: number;
  lossesReported: number;
  lossesBySignal: number;
  /**
   * Losses of a holder whose own file was not deleted, while a deleted
   * holder of the same lock had not finished its release (see the top).
   */
  lossesCascade: number;
  /** Losses reported with no deletion during the session: must be 0. */
  lossesWithoutDeletion: number;
  /**
   * Deletions of a holder's file that its holder never reported and that no
   * SIGKILL explains: each is the documented window (the holder was paused
   * between its release's lstat and unlink, so its release removed its
   * successor's file instead), whose successor reports a cascade loss.
   */
  deletionsSilent: number;
  /** Deletions of a holder's file whose holder was SIGKILLed before it reported. */
  deletionsOfKilled: number;
  errors: number;
  errorSamples: string[];
  worstWaitMs: number;
  /** Temp files and lock files found after the run, before the final clean acquire. */
  litterBeforeClean: string[];
  /** Entries left after one clean acquire and release per lock: must be []. */
  leftAfterClean: string[];
  violations: string[];
}

export interface SoakOptions {
  seconds: number;
  locks: number;
  /** One command per worker slot (the runtime's soak_worker), by runtime. */
  workers: { runtime: string; command: string[] | undefined }[];
  /** The command that runs fixtures/inject_fixture.ts "clean" at the end. */
  clean?: string[];
  dir: string;
  /** Mean milliseconds between the killer's actions. */
  every?: number;
  /**
   * Each lock in a directory of its own, and half of the deletions made by
   * moving that directory away and making a new one in its place (`mv d
   * d.old && mkdir d`): a holder's file leaves the path with it, and a
   * waiter that pinned the old directory must not take the lock there.
   */
  moves?: boolean;
  /**
   * Events the run must contain: after `seconds`, the killer goes on until
   * it has made these (a loaded machine makes fewer per second), giving up
   * `deadline` seconds after the start (default: 60 + 4 × seconds).
   */
  minimum?: {
    acquisitions?: number;
    kills?: number;
    stops?: number;
    deletions?: number;
  };
  deadline?: number;
  log?: (line: string) => void;
}

// Child.signal: process.kill of the worker's own PID, and only while the
// handle has not seen it exit (a reaped worker's PID may be anyone's now).
function signal(w: Worker, name: NodeJS.Signals): void {
  w.child.signal(name);
}

/**
 * Resolves once every thread of the worker is stopped (Linux /proc), or
 * the worker exited: SIGSTOP takes effect asynchronously.
 */
async function stoppedNow(w: Worker): Promise<void> {
  const tasks = `/proc/${w.child.pid}/task`;
  if (!existsSync("/proc/self/task")) return await delay(20);
  while (w.child.running) {
    let all = true;
    try {
      for (const t of readdirSync(tasks)) {
        const stat = readFileSync(`${tasks}/${t}/stat`, "utf8");
        const state = stat.slice(stat.lastIndexOf(")") + 2)[0];
        if (state !== "T" && state !== "t") all = false;
      }
    } catch {
      return; // exited
    }
    if (all) return;
    await delay(1);
  }
}

interface Worker {
  child: Child;
  runtime: string;
  slot: number;
  stopped: boolean;
}

/** Runs a soak and returns its report (throws nothing for violations). */
export async function soak(options: SoakOptions): Promise<SoakReport> {
  const { seconds, dir } = options;
  const every = options.every ?? 60;
  const say = options.log ?? (() => {});
  const lockDir = join(dir, "locks");
  mkdirSync(lockDir, { recursive: true });
  const log = join(dir, "log");
  appendFileSync(log, "");
  const paths = Array.from(
    { length: options.locks },
    (_, k) =>
      options.moves
        ? join(lockDir, `lock-${k}`, "run.lock")
        : join(lockDir, `lock-${k}`),
  );
  const movedDir = join(dir, "moved");
  if (options.moves) {
    mkdirSync(movedDir);
    for (const path of paths) mkdirSync(dirname(path));
  }
  /** The entries of the lock directories (each lock's, with `moves`). */
  const entries = () =>
    options.moves
      ? paths.flatMap((path) =>
        existsSync(dirname(path))
          ? readdirSync(dirname(path)).map((n) =>
            `${basename(dirname(path))}/${n}`
          )
          : []
      )
      : existsSync(lockDir)
      ? readdirSync(lockDir)
      : [];
  const began = Date.now();
  const until = began + seconds * 1000;
  const deadline = began + (options.deadline ?? 60 + 4 * seconds) * 1000;
  const minimum = options.minimum ?? {};
  // Workers run until this file exists.
  const stopFile = join(dir, "stop");
  const workers = new Map<number, Worker>();
  let processes = 0;
  const killed = new Set<number>();
  const runtimeOf = new Map<number, string>();
  const counts = { kills: 0, stops: 0, deletions: 0, moves: 0 };

  const start = (slot: number) => {
    const { runtime, command } = options.workers[slot];
    const child = new Child(
      "soak_worker.ts",
      [log, stopFile, ...paths],
      undefined,
      command,
    );
    workers.set(child.pid, { child, runtime, slot, stopped: false });
    runtimeOf.set(child.pid, runtime);
    processes++;
  };
  for (let slot = 0; slot < options.workers.length; slot++) start(slot);

  const holderOf = (k: number): Worker | undefined => {
    let text: string;
    try {
      text = readFileSync(paths[k], "utf8");
    } catch {
      return undefined;
    }
    return workers.get(Number(text.split("\n")[0]));
  };

  const note = (line: string) => appendFileSync(log, line + "\n");
  // SIGSTOP, then SIGCONT 20-300 ms later (by the returned function, when
  // `later` is false: the caller decides when).
  const stop = (victim: Worker, later = true): () => void => {
    victim.stopped = true;
    note(`stop ${victim.child.pid}`);
    signal(victim, "SIGSTOP");
    counts.stops++;
    const resume = () => {
      setTimeout(() => {
        victim.stopped = false;
        signal(victim, "SIGCONT");
      }, 20 + Math.random() * 280);
    };
    if (later) resume();
    return resume;
  };
  let step = 0;
  let lastReport = Date.now();
  const acquisitions = () =>
    readFileSync(log, "utf8").split("\nenter ").length - 1;
  // Past `seconds`: whether the run has all the events it must contain.
  const enough = () =>
    counts.kills >= (minimum.kills ?? 0) &&
    counts.stops >= (minimum.stops ?? 0) &&
    counts.deletions >= (minimum.deletions ?? 0) &&
    (minimum.acquisitions === undefined ||
      acquisitions() >= minimum.acquisitions);
  try {
    while (
      Date.now() < until || (!enough() && Date.now() < deadline)
    ) {
      await delay(every * (0.5 + Math.random()));
      // A lock whose holder is running, when there is one.
      const running = paths.map((_, i) => i).filter((i) => {
        const h = holderOf(i);
        return h !== undefined && !h.stopped;
      });
      const k = running.length > 0
        ? running[Math.floor(Math.random() * running.length)]
        : Math.floor(Math.random() * paths.length);
      const action = step++ % 3;
      if (action === 0) {
        // SIGKILL the holder of a lock (it may be inside, or just leaving).
        const victim = holderOf(k);
        if (!victim || victim.stopped) continue;
        note(`kill ${victim.child.pid}`);
        killed.add(victim.child.pid);
        workers.delete(victim.child.pid);
        signal(victim, "SIGKILL");
        await victim.child.exited;
        counts.kills++;
        start(victim.slot);
      } else if (action === 1) {
        // SIGSTOP a worker (the holder of a lock, when there is one).
        const list = [...workers.values()].filter((w) => !w.stopped);
        const victim = holderOf(k) ??
          list[Math.floor(Math.random() * list.length)];
        if (!victim || victim.stopped) continue;
        stop(victim);
      } else {
        // Delete a lock file by hand, as a careless cleanup job would. Its
        // holder is stopped first, so that the file names its holder for
        // sure when it goes (nobody else can replace it while the holder
        // keeps its flock) and the log can tell whose lock was deleted.
        const victim = holderOf(k);
        if (!victim || victim.stopped) continue;
        // Stopped until the deletion is done (its SIGCONT is scheduled
        // only then, so a loaded machine's late timers cannot let it go
        // on in between); if it still holds the lock, the file is its.
        const resume = stop(victim, false);
        await stoppedNow(victim);
        try {
          if (holderOf(k) === victim) {
            if (options.moves && Math.random() < 0.5) {
              const from = dirname(paths[k]);
              renameSync(from, join(movedDir, `lock-${k}.${counts.moves}`));
              mkdirSync(from);
              counts.moves++;
            } else {
              unlinkSync(paths[k]);
            }
            note(`deleted ${k} ${victim.child.pid}`);
            counts.deletions++;
          }
        } catch {
          // Gone already.
        } finally {
          resume();
        }
      }
      if (Date.now() - lastReport > 10_000) {
        lastReport = Date.now();
        const entered = acquisitions();
        say(
          `  ${
            Math.max(0, Math.round((until - Date.now()) / 1000))
          } s left: ${entered} acquisitions, ${counts.kills} kills, ` +
            `${counts.stops} stops, ${counts.deletions} deletions`,
        );
      }
    }
    // Tell the workers to finish, let every stopped one go on, and wait for
    // all of them (a resume still scheduled finds its worker gone).
    writeFileSync(stopFile, "");
    for (const w of workers.values()) signal(w, "SIGCONT");
    for (const w of workers.values()) {
      const event = await w.child.next().catch((err) => ({
        event: "error",
        message: String(err),
      }));
      if (event.event !== "done") {
        note(`error ${w.child.pid} worker: ${JSON.stringify(event)}`);
      }
      await w.child.exited;
    }
  } finally {
    for (const w of workers.values()) {
      signal(w, "SIGCONT");
      signal(w, "SIGKILL");
      await w.child.exited;
    }
  }

  const report = analyse(readFileSync(log, "utf8"), {
    seconds,
    runtimes: [...new Set(options.workers.map((w) => w.runtime))],
    locks: options.locks,
    workers: options.workers.length,
    processes,
    runtimeOf,
  });
  report.kills = counts.kills;
  report.stops = counts.stops;
  report.deletions = counts.deletions;
  report.moves = counts.moves;

  // Litter, then one clean acquire and release per lock in a fresh process.
  report.litterBeforeClean = entries().sort();
  const [cmd, args] = options.clean
    ? [options.clean[0], options.clean.slice(1)]
    : fixtureCommand("inject_fixture.ts", []);
  const clean = spawnSync(cmd, [...args, "clean", ...paths], {
    encoding: "utf8",
  });
  for (const line of clean.stdout.trim().split("\n").filter(Boolean)) {
    const step = JSON.parse(line);
    if (!step.ok) report.violations.push(`final clean acquire: ${line}`);
  }
  report.leftAfterClean = entries();
  if (report.leftAfterClean.length > 0) {
    report.violations.push(
      `left after the clean acquire: ${report.leftAfterClean.join(", ")}`,
    );
  }
  rmSync(lockDir, { recursive: true, force: true });
  return report;
}

interface Session {
  lock: number;
  pid: number;
  n: number;
  /** The killer deleted this session's file (matched to its loss). */
  deleted: boolean;
  /**
   * While it was open, a holder of the same lock whose file the killer
   * deleted had not finished its release (whose unlink may then hit this
   * session's file).
   */
  exposed: boolean;
  /** The killer deleted this session's file (reported or not). */
  fileDeleted?: boolean;
  /** SIGKILLed while this session was open. */
  killed?: boolean;
  lost?: string;
}

/** Replays the log against the rules; see the top of this file. */
export function analyse(
  text: string,
  base: {
    seconds: number;
    runtimes: string[];
    locks: number;
    workers: number;
    processes: number;
    runtimeOf: Map<number, string>;
  },
): SoakReport {
  const violations: string[] = [];
  const errorSamples: string[] = [];
  const killed = new Set<number>();
  const open = new Map<number, Session[]>(); // lock -> sessions inside
  const sessions = new Map<string, Session>(); // "pid n" -> session
  const pairs: [Session, Session][] = [];
  // Deletions not yet matched to a loss: "lock pid" -> count.
  const deletions = new Map<string, number>();
  const deletedOnce = new Set<string>();
  // Per lock: pids whose file the killer deleted and whose release has not
  // finished yet.
  const pending = new Map<number, Set<number>>();
  const graceEnters = new Map<number, number>();
  let cascadeLosses = 0;
  const cascadeByLock = new Map<number, number>();
  const silentByLock = new Map<number, number>();
  const exposedKillsByLock = new Map<number, number[]>();
  const silentPids = new Map<number, Set<number>>();
  let acquisitions = 0;
  let killsInside = 0;
  let errors = 0;
  let worstWaitMs = 0;
  let lossesReported = 0;
  let lossesBySignal = 0;
  let lossesWithoutDeletion = 0;
  const byRuntime: Record<string, number> = {};
  const inside = (k: number) => open.get(k) ?? [];
  for (const line of text.split("\n")) {
    if (line === "") continue;
    const [what, a, b, c, d] = line.split(" ");
    switch (what) {
      case "enter": {
        const k = Number(a);
        const pid = Number(b);
        // A deletion this worker has not reported by its next session it
        // never will: silent (the release window), to be matched below.
        const unreported = deletions.get(`${k} ${pid}`) ?? 0;
        if (unreported > 0) {
          deletions.set(`${k} ${pid}`, 0);
          silentByLock.set(k, (silentByLock.get(k) ?? 0) + unreported);
          silentPids.set(k, (silentPids.get(k) ?? new Set()).add(pid));
        }
        acquisitions++;
        worstWaitMs = Math.max(worstWaitMs, Number(d));
        const runtime = base.runtimeOf.get(pid) ?? "?";
        byRuntime[runtime] = (byRuntime[runtime] ?? 0) + 1;
        const session: Session = {
          lock: k,
          pid,
          n: Number(c),
          deleted: false,
          exposed: (pending.get(k)?.size ?? 0) > 0 ||
            (graceEnters.get(k) ?? 0) > 0,
        };
        if ((graceEnters.get(k) ?? 0) > 0) {
          graceEnters.set(k, graceEnters.get(k)! - 1);
        }
        // Sessions of SIGKILLed workers are over: the kernel dropped their
        // flock. Anyone else still inside is an overlap.
        const live = inside(k).filter((s) => !killed.has(s.pid));
        for (const other of live) pairs.push([other, session]);
        open.set(k, [...live, session]);
        sessions.set(`${pid} ${c}`, session);
        break;
      }
      case "leave": {
        const k = Number(a);
        open.set(
          k,
          inside(k).filter((s) => !(s.pid === Number(b) && s.n === Number(c))),
        );
        break;
      }
      case "lost": {
        const session = sessions.get(`${b} ${c}`);
        if (!session) {
          violations.push(`a loss of a session never entered: ${line}`);
          break;
        }
        session.lost = d;
        lossesReported++;
        if (d === "signal") lossesBySignal++;
        // Every loss must be caused by a deletion of that lock's file while
        // this worker held it, logged before the loss.
        const key = `${a} ${b}`;
        const left = deletions.get(key) ?? 0;
        if (left > 0) {
          deletions.set(key, left - 1);
          session.deleted = true;
        } else if (session.exposed) {
          cascadeLosses++;
          cascadeByLock.set(Number(a), (cascadeByLock.get(Number(a)) ?? 0) + 1);
        } else {
          lossesWithoutDeletion++;
          if (lossesWithoutDeletion <= 5) {
            violations.push(`a loss with no deletion before it: ${line}`);
          }
        }
        break;
      }
      case "deleted": {
        const key = `${a} ${b}`;
        deletions.set(key, (deletions.get(key) ?? 0) + 1);
        deletedOnce.add(key);
        const k = Number(a);
        if (!pending.has(k)) pending.set(k, new Set());
        pending.get(k)!.add(Number(b));
        for (const s of inside(k)) {
          if (s.pid !== Number(b)) s.exposed = true;
          else s.fileDeleted = true;
        }
        break;
      }
      case "released": {
        // A successor that linked its file before this release's unlink may
        // log its "enter" after this line: the next two entries on the lock
        // still count as exposed.
        const set = pending.get(Number(a));
        if (set?.delete(Number(b))) {
          graceEnters.set(Number(a), (graceEnters.get(Number(a)) ?? 0) + 2);
        }
        break;
      }
      case "kill": {
        const pid = Number(a);
        killed.add(pid);
        for (const set of pending.values()) set.delete(pid);
        for (const [k, list] of open) {
          const inside = list.find((s) => s.pid === pid);
          if (inside) killsInside++;
          if (inside) inside.killed = true;
          // A successor killed before it could report a cascade loss.
          if (inside?.exposed) {
            exposedKillsByLock.set(k, [
              ...(exposedKillsByLock.get(k) ?? []),
              pid,
            ]);
          }
        }
        break;
      }
      case "error":
        errors++;
        if (errorSamples.length < 5) errorSamples.push(line);
        break;
    }
  }
  // An overlap is explained only by a deletion of the file of one of the
  // two sessions, reported by its holder as lost (or whose holder was
  // SIGKILLed before it could report).
  let overlapsReported = 0;
  let overlapsHolderKilled = 0;
  let overlapsUnexplained = 0;
  for (const [x, y] of pairs) {
    if (
      ((x.deleted || x.exposed) && x.lost) ||
      ((y.deleted || y.exposed) && y.lost)
    ) {
      overlapsReported++;
    } else if (
      [x, y].some((s) => s.killed === true && !s.lost && s.fileDeleted === true)
    ) {
      overlapsHolderKilled++;
    } else {
      overlapsUnexplained++;
      if (overlapsUnexplained <= 5) {
        violations.push(
          `overlap on lock ${x.lock}: pid ${x.pid} (round ${x.n}) was inside ` +
            `when pid ${y.pid} (round ${y.n}) entered, and no reported ` +
            `deletion explains it`,
        );
      }
    }
  }
  // Deletions their holder did not report: excused only if that holder was
  // SIGKILLed inside the same session (it never entered again); otherwise
  // silent, and each silent deletion of a lock must be matched by a
  // successor on that lock that reported a cascade loss, or was SIGKILLed
  // while exposed (before it could report).
  let deletionsOfKilled = 0;
  for (const [key, left] of deletions) {
    if (left === 0) continue;
    const [k, pid] = key.split(" ").map(Number);
    if (killed.has(pid)) deletionsOfKilled += left;
    else {
      silentByLock.set(k, (silentByLock.get(k) ?? 0) + left);
      silentPids.set(k, (silentPids.get(k) ?? new Set()).add(pid));
    }
  }
  let deletionsSilent = 0;
  for (const [k, silent] of silentByLock) {
    deletionsSilent += silent;
    // (A successor is another worker: a silent holder's own later
    // session, killed, explains nothing.)
    const matched = (cascadeByLock.get(k) ?? 0) +
      (exposedKillsByLock.get(k) ?? []).filter((pid) =>
        !silentPids.get(k)?.has(pid)
      ).length;
    if (silent > matched) {
      violations.push(
        `lock ${k}: ${silent} deletions their holders never reported, but ` +
          `only ${matched} successors that reported a cascade loss or were ` +
          `killed before they could`,
      );
    }
  }
  if (errors > 0) violations.push(`${errors} worker errors`);
  if (overlapsUnexplained > 5) {
    violations.push(`${overlapsUnexplained} unexplained overlaps in all`);
  }
  return {
    seconds: base.seconds,
    runtimes: base.runtimes,
    locks: base.locks,
    workers: base.workers,
    processes: base.processes,
    acquisitions,
    acquisitionsByRuntime: byRuntime,
    kills: 0,
    killsInside,
    stops: 0,
    deletions: 0,
    moves: 0,
    overlaps: pairs.length,
    overlapsReported,
    overlapsHolderKilled,
    overlapsUnexplained,
    lossesReported,
    lossesBySignal,
    lossesCascade: cascadeLosses,
    lossesWithoutDeletion,
    deletionsSilent,
    deletionsOfKilled,
    errors,
    errorSamples,
    worstWaitMs: Math.round(worstWaitMs),
    litterBeforeClean: [],
    leftAfterClean: [],
    violations,
  };
}

/** The report as a few lines for a person. */
export function summary(r: SoakReport): string {
  const by = Object.entries(r.acquisitionsByRuntime)
    .map(([k, v]) => `${k} ${v}`).join(", ");
  return [
    `soak: ${r.seconds} s, ${
      r.runtimes.join("+")
    }, ${r.locks} locks, ${r.workers} workers (${r.processes} processes in all)`,
    `  acquisitions: ${r.acquisitions} (${by})`,
    `  kills: ${r.kills} (${r.killsInside} inside the critical section), stops: ${r.stops}, deletions of a held lock's file: ${r.deletions}${
      r.moves ? ` (${r.moves} by moving its directory away)` : ""
    }`,
    `  overlaps (an entry while another worker was still inside): ${r.overlaps}; after a deletion, reported as lost: ${r.overlapsReported}; holder SIGKILLed before it could report: ${r.overlapsHolderKilled}; unexplained: ${r.overlapsUnexplained}`,
    `  losses reported: ${r.lossesReported} (${r.lossesBySignal} by lock.signal before release; ${r.lossesCascade} cascade: a deleted holder's late release unlinked its successor's file), ${r.lossesWithoutDeletion} without a deletion; ${r.deletionsSilent} deletions reported only by a successor (the release window)`,
    `  errors: ${r.errors}${
      r.errorSamples.length ? ` e.g. ${r.errorSamples[0]}` : ""
    }`,
    `  worst wait: ${r.worstWaitMs} ms`,
    `  litter after the run: ${
      r.litterBeforeClean.filter((n) => n.endsWith(".tmp")).length
    } temp files, ${
      r.litterBeforeClean.filter((n) => !n.endsWith(".tmp")).length
    } lock files (stale or held by the last workers); after one clean acquire per lock: ${r.leftAfterClean.length}`,
    `  violations: ${r.violations.length ? r.violations.join("; ") : "none"}`,
  ].join("\n");
}
