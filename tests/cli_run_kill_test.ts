// `runlock run` hands its lock's descriptor on to its command, as flock(1)
// does: when runlock's own process is SIGKILLed (an operator's kill -9,
// the OOM killer, a supervisor that kills the main PID), the command keeps
// the flock, so no second run starts beside it; once the command ends, the
// next run takes the lock at once. Real processes: the CLI under test (on
// Deno, Node, Bun and the compiled binary, see tests/_cli.ts), and its
// command, a shell that waits on a FIFO until the test writes to it.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { cli, cliRuntime, start } from "./_cli.ts";
import { tempDir } from "./_helpers.ts";

declare const Deno: { execPath(): string } | undefined;

const hasMkfifo = spawnSync("mkfifo", ["--version"]).status === 0;

/**
 * `runlock run <lock> -- sh -c 'echo ready; read x < <fifo>'` started by
 * `begin`, SIGKILLed once the command runs; then what a second run and
 * status say while the command lives, and what a run says once the test
 * has ended the command through its FIFO.
 */
async function killedRunner(
  begin: (lock: string, command: string[]) => {
    ready: Promise<void>;
    kill(): Promise<void>;
  },
  saysGone = true,
): Promise<void> {
  const { dir, cleanup } = tempDir();
  const lock = join(dir, "run.lock");
  const fifo = join(dir, "fifo");
  assert.equal(spawnSync("mkfifo", [fifo]).status, 0);
  let ended = false;
  const end = () => {
    if (!ended) writeFileSync(fifo, "go\n");
    ended = true;
  };
  try {
    const runner = begin(lock, [
      "sh",
      "-c",
      'echo ready; read x < "$1"',
      "sh",
      fifo,
    ]);
    await runner.ready;
    await runner.kill();
    const second = cli("run", lock, "--", "true");
    assert.equal(
      second.code,
      75,
      `a second run while the command lives: ${JSON.stringify(second)}`,
    );
    const status = cli("status", lock);
    assert.equal(status.code, 0, JSON.stringify(status));
    // The record names runlock's pid, which is gone: status says so where
    // the record lets it tell that pid is this host's (its boot and PID
    // namespace, which Deno without --allow-read for /proc does not write).
    assert.match(
      status.stdout,
      saysGone
        ? /^held by pid \d+ on .* \(pid \d+ is gone: the command it ran, or what that started, holds the lock; fuser -v names it\)/
        : /^held by pid \d+/,
    );
    end();
    // At once: no --wait, and nothing to clean up by hand.
    const third = cli("run", lock, "--", "true");
    assert.equal(third.code, 0, JSON.stringify(third));
  } finally {
    end();
    cleanup();
  }
}

describe("runlock run SIGKILLed while its command runs", {
  skip: !hasMkfifo || process.platform !== "linux",
}, () => {
  test("the command keeps the lock: a second run exits 75 and status says held until the command ends, then the next run takes it at once", async () => {
    await killedRunner((lock, command) => {
      const runner = start("run", lock, "--", ...command);
      return {
        ready: runner.line(/^ready$/).then(() => {}),
        kill: async () => {
          runner.signal("SIGKILL");
          await runner.died;
        },
      };
    });
  });

  test(
    "under Deno with the install line's permissions (no FFI), the command keeps the lock the same way",
    {
      skip: cliRuntime !== "deno" || process.env.RUNLOCK_CLI !== undefined,
    },
    async () => {
      const cliTs = join(
        new URL(".", import.meta.url).pathname,
        "..",
        "src",
        "cli.ts",
      );
      await killedRunner((lock, command) => {
        const runner = spawn(Deno!.execPath(), [
          "run",
          "--quiet",
          "--allow-read",
          "--allow-write",
          "--allow-sys=hostname",
          "--allow-run",
          "--allow-env",
          cliTs,
          "run",
          lock,
          "--",
          ...command,
        ], { stdio: ["ignore", "pipe", "inherit"] });
        const died = new Promise((r) => runner.on("exit", r));
        return {
          ready: new Promise<void>((resolve, reject) => {
            let out = "";
            runner.stdout!.on("data", (d) => {
              out += d;
              if (out.includes("ready\n")) resolve();
            });
            runner.on(
              "exit",
              () => reject(new Error(`runlock run ended: ${out}`)),
            );
          }),
          kill: async () => {
            runner.kill("SIGKILL");
            await died;
          },
        };
      }, false);
    },
  );
});
