// The README, exactly as written: its Deno command lines and programs, taken
// from the README itself (tests/_readme.ts) and run in a fresh copy of the
// repository, as a user with a clone would. (The npm lines and the Node
// example are run by scripts/test_npm.ts; the demo line by
// tests/first_run_test.ts.) Deno only.
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { hostname, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import process from "node:process";
import { describe, test } from "node:test";
import { commandLines, readmeBlock, root } from "./_readme.ts";
import { holder, runtime, waitFor } from "./_helpers.ts";
import { Reads } from "./_cli.ts";

declare const Deno: { execPath(): string };

/** PATH with the running deno first: the README says `deno`. */
function env(): Record<string, string> {
  return {
    ...process.env as Record<string, string>,
    PATH: `${dirname(Deno.execPath())}:${process.env.PATH}`,
    NO_COLOR: "1",
  };
}

/** A scratch directory holding a copy of the clone's mod.ts and src/. */
function clone(): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), "runlock-readme-"));
  cpSync(join(root, "mod.ts"), join(dir, "mod.ts"));
  cpSync(join(root, "src"), join(dir, "src"), { recursive: true });
  cpSync(join(root, "deno.json"), join(dir, "deno.json"));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

function sh(line: string, cwd: string) {
  const r = spawnSync("sh", ["-c", line], {
    cwd,
    env: env(),
    encoding: "utf8",
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

function until(condition: () => boolean): Promise<void> {
  return waitFor(condition, "the README's program");
}

describe("the README, as written", { skip: runtime !== "deno" }, () => {
  test("the Deno command lines of `runlock` work with exactly the flags they show: status, run, wait", async () => {
    const [status, run, wait] = commandLines(readmeBlock("deno-cli"));
    assert.match(status, /src\/cli\.ts status /);
    assert.match(run, /src\/cli\.ts run .* -- \.\/sync\.sh$/);
    assert.match(wait, /src\/cli\.ts wait /);
    const { dir, cleanup } = clone();
    try {
      writeFileSync(
        join(dir, "sync.sh"),
        "#!/bin/sh\necho syncing\nwhile [ ! -e done ]; do sleep 0.05; done\n",
        { mode: 0o755 },
      );
      const free = sh(status, dir);
      assert.equal(free.code, 1, free.stderr);
      assert.equal(free.stdout, "free\n");

      const guarded = spawn("sh", ["-c", run], {
        cwd: dir,
        env: env(),
        stdio: ["ignore", "pipe", "pipe"],
      });
      let out = "";
      let err = "";
      guarded.stdout!.on("data", (d) => (out += d));
      guarded.stderr!.on("data", (d) => (err += d));
      const exited = new Promise<number | null>((resolve) =>
        guarded.on("close", (code) => resolve(code))
      );
      await until(() => out.includes("syncing"));
      const held = sh(status, dir);
      assert.equal(held.code, 0, held.stderr);
      assert.match(
        held.stdout,
        new RegExp(`^held by pid \\d+ on ${hostname()} since `),
        "--allow-sys=hostname recorded the host",
      );

      // `wait` has begun waiting once it has read the held lock file (the
      // holder never reads its own).
      const reads = await Reads.watch(
        join(dir, ".state", "run.lock"),
        join(dir, "mark"),
      );
      const waiting = spawn("sh", ["-c", wait], { cwd: dir, env: env() });
      const waited = new Promise<number | null>((resolve) =>
        waiting.on("close", (code) => resolve(code))
      );
      try {
        await reads.reads(1);
      } finally {
        await reads.stop();
      }
      // It read the held lock and is still there: it waits.
      assert.equal(
        waiting.exitCode,
        null,
        "wait returned while the lock was held",
      );
      writeFileSync(join(dir, "done"), "");
      assert.equal(await exited, 0, err);
      assert.equal(await waited, 0);
      assert.equal(existsSync(join(dir, ".state", "run.lock")), false);
    } finally {
      cleanup();
    }
  });

  test("Quick start: the deno.json mapping to a clone, the program and its deno run line work; a second run gets the holder's message and exit 75", async () => {
    const work = mkdtempSync(join(tmpdir(), "runlock-readme-project-"));
    try {
      // A clone next to the project, as the README says ("../runlock").
      symlinkSync(root, join(work, "runlock"));
      const project = join(work, "project");
      mkdirSync(project);
      const config = readmeBlock("deno-json");
      assert.equal(config.lang, "json");
      writeFileSync(join(project, "deno.json"), config.text);
      const program = readmeBlock("quick-start");
      assert.equal(program.lang, "ts");
      writeFileSync(join(project, "main.ts"), program.text);
      const [line] = commandLines(readmeBlock("deno-run"));
      assert.match(line, /^deno run .* main\.ts$/);

      const free = sh(line, project);
      assert.equal(free.code, 0, free.stderr);
      assert.equal(existsSync(join(project, ".state", "run.lock")), false);

      const first = await holder(join(project, ".state", "run.lock"));
      try {
        const refused = sh(line, project);
        assert.equal(refused.code, 75);
        assert.match(
          refused.stderr,
          new RegExp(
            `run\\.lock: another run is active as pid ${first.pid} on ${hostname()}; wait for it or stop it`,
          ),
        );
      } finally {
        await first.kill();
      }
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  });

  test("Releasing on Ctrl-C and kill: without a handler SIGTERM leaves a stale file; the README's pattern releases, so status reads free", async () => {
    const { dir, cleanup } = clone();
    const path = join(dir, ".state", "run.lock");
    try {
      // Without the pattern: a plain holder ended by SIGTERM.
      const plain = await holder(path);
      await plain.kill("SIGTERM");
      assert.equal(existsSync(path), true, "the file stays");
      const stale = sh(`deno run --allow-read src/cli.ts status ${path}`, dir);
      assert.match(stale.stdout, /^stale: last holder pid \d+ is gone/);
      rmSync(path);

      const block = readmeBlock("release-on-signals");
      assert.equal(block.lang, "ts");
      // The README's program, unchanged, imported by a main module that
      // says when the program's top level (acquire, then the listeners) has
      // run: the signal is sent only then.
      writeFileSync(join(dir, "readme.ts"), block.text);
      writeFileSync(
        join(dir, "main.ts"),
        'import "./readme.ts";\nconsole.log("listening");\n',
      );
      const cases = [["SIGTERM", 143], ["SIGINT", 130]] as const;
      for (const [signal, code] of cases) {
        const program = spawn(Deno.execPath(), [
          "run",
          "--quiet",
          "--allow-read=.state",
          "--allow-write=.state",
          "main.ts",
        ], { cwd: dir, env: env(), stdio: ["ignore", "pipe", "inherit"] });
        let out = "";
        program.stdout!.on("data", (d) => (out += d));
        const exited = new Promise<number | null>((resolve) =>
          program.on("close", (c) => resolve(c))
        );
        await until(() => out.includes("listening\n"));
        assert.equal(existsSync(path), true, "it holds the lock");
        // process.kill of our own child's PID (it runs: it just said so):
        // Deno's ChildProcess.kill reports an exit by the signal at once.
        process.kill(program.pid!, signal);
        assert.equal(await exited, code, signal);
        assert.equal(existsSync(path), false, `released on ${signal}`);
        const free = sh(`deno run --allow-read src/cli.ts status ${path}`, dir);
        assert.equal(free.stdout, "free\n");
      }
    } finally {
      cleanup();
    }
  });

  test("PROTOCOL.md is the reference the README names, and speaks to users and implementers only", () => {
    const readme = readFileSync(join(root, "README.md"), "utf8");
    assert.match(readme, /\[PROTOCOL\.md\]\(PROTOCOL\.md\) is the reference/);
    assert.doesNotMatch(readme, /shared design notes/);
    const protocol = readFileSync(join(root, "PROTOCOL.md"), "utf8");
    assert.doesNotMatch(protocol, /closing note/i);
  });
});
