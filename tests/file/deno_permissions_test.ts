// Deno permissions: the lock works with read and write access to its own
// directory and nothing else, and never prompts. (Deno only: Node and Bun
// have no permission system, so these tests are skipped there.)
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  existsSync,
  mkdirSync,
  readdirSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { Child, deadPid, fixtureCommand, tempDir } from "../_helpers.ts";

const isDeno = "Deno" in globalThis;

function only(dir: string, write = true): string[] {
  const flags = [`--allow-read=${dir}`, "--no-prompt"];
  if (write) flags.push(`--allow-write=${dir}`);
  return flags;
}

describe("Deno permissions", { skip: !isDeno }, () => {
  test("with only --allow-read and --allow-write on the lock's directory: acquire, HeldError, probes and release all work", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "state", "run.lock");
    const holder = new Child("child.ts", ["hold", path], only(dir));
    try {
      const acquired = await holder.expect("acquired");
      const contender = new Child("child.ts", ["try", path], only(dir));
      const refused = await contender.expect("held");
      assert.equal(refused.holder, acquired.pid);
      // No --allow-sys: the host name is simply not recorded.
      assert.equal(refused.host, "");
      assert.match(
        String(refused.message),
        new RegExp(
          `another run is active as pid ${acquired.pid}; wait for it or stop it$`,
        ),
      );

      const prober = new Child("child.ts", ["probe", path], only(dir, false));
      const probe = await prober.expect("probe");
      assert.equal(probe.state, "held");
      assert.equal(probe.holder, acquired.pid);

      holder.send("release");
      await holder.expect("released");
      const after = new Child("child.ts", ["probe", path], only(dir, false));
      assert.equal((await after.expect("probe")).state, "free");
    } finally {
      await holder.kill();
      cleanup();
    }
  });

  test("a SIGKILLed holder's file is taken over with only directory access", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "run.lock");
    try {
      const first = new Child("child.ts", ["hold", path], only(dir));
      await first.expect("acquired");
      await first.kill("SIGKILL");
      const second = new Child("child.ts", ["try", path], only(dir));
      await second.expect("acquired");
      assert.equal((await second.exited).code, 0);
    } finally {
      cleanup();
    }
  });

  test("without --allow-write, acquire fails with LockPermissionError naming the grant, never a prompt", () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.lock");
      // `script` gives the child a terminal, where Deno would prompt and
      // hang if runlock asked for a permission instead of querying it.
      const [cmd, args] = fixtureCommand("child.ts", ["try", path], [
        `--allow-read=${dir}`,
      ]);
      const line = [cmd, ...args].map((a) => `'${a}'`).join(" ");
      const result = spawnSync("script", ["-qec", line, "/dev/null"], {
        encoding: "utf8",
        timeout: 20_000,
        input: "",
      });
      assert.equal(
        result.error,
        undefined,
        "the child did not hang on a prompt",
      );
      assert.doesNotMatch(result.stdout, /Deno requests/);
      const event = JSON.parse(result.stdout.trim().split("\n").pop()!);
      assert.equal(event.event, "error");
      assert.equal(event.name, "LockPermissionError");
      assert.match(event.message, new RegExp(`--allow-write=${dir}`));
    } finally {
      cleanup();
    }
  });

  test("without --allow-run a foreign pidfile cannot be proven dead, so it counts as held", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const path = join(dir, "run.pid");
      const dead = deadPid();
      writeFileSync(path, `${dead}\n`);
      const prober = new Child("child.ts", ["probe", path], only(dir));
      assert.equal((await prober.expect("probe")).state, "held");
      const contender = new Child("child.ts", ["try", path], only(dir));
      assert.equal((await contender.expect("held")).holder, dead);
      // With --allow-run, kill(pid, 0) proves it dead.
      const allowed = new Child("child.ts", ["try", path], [
        ...only(dir),
        "--allow-run",
      ]);
      await allowed.expect("acquired");
    } finally {
      cleanup();
    }
  });

  test("--allow-all with a --deny of something unrelated (a partial grant) still takes the lock", async () => {
    const { dir, cleanup } = tempDir();
    try {
      const child = new Child("child.ts", ["try", join(dir, "run.lock")], [
        "--allow-all",
        "--deny-net=169.254.169.254",
      ]);
      await child.expect("acquired");
    } finally {
      cleanup();
    }
  });

  test("through a symlinked directory, the hint names the real directory that needs the grant and keeps the symlink's read grant, and following it takes the lock; a probe's hint asks only for read", () => {
    const { dir, cleanup } = tempDir();
    try {
      const real = join(dir, "releases", "1");
      mkdirSync(real, { recursive: true });
      symlinkSync(real, join(dir, "current"));
      const path = join(dir, "current", "run.lock");
      const current = join(dir, "current");
      const tried = underTerminal(["try", path], [
        `--allow-read=${current}`,
        `--allow-write=${current}`,
      ]);
      assert.equal(tried.name, "LockPermissionError", JSON.stringify(tried));
      assert.match(String(tried.message), new RegExp(`--allow-write=${real}`));
      // Followed as written, in place of the flags given.
      const hint = /run Deno with (.*) \(runlock never prompts\)/.exec(
        String(tried.message),
      );
      assert.ok(hint, String(tried.message));
      const followed = underTerminal(["try", path], hint[1].split(" "));
      assert.equal(followed.event, "acquired", JSON.stringify(followed));
      const probed = underTerminal(
        ["probe", join(dir, "elsewhere", "x.lock")],
        [],
      );
      assert.equal(probed.name, "LockPermissionError", JSON.stringify(probed));
      assert.match(String(probed.message), /--allow-read=\//);
      assert.doesNotMatch(String(probed.message), /--allow-write=/);
    } finally {
      cleanup();
    }
  });

  test("a path with .. after a symlink names the file the kernel names, with scoped permissions as with --allow-all: one holder, and probes agree", async () => {
    // Deno's ops resolve `..` by the text unless every permission is
    // granted: `b/link/..` was `b` there, and `a` for the kernel.
    const { dir, cleanup } = tempDir();
    mkdirSync(join(dir, "a", "real"), { recursive: true });
    mkdirSync(join(dir, "b"));
    symlinkSync(join(dir, "a", "real"), join(dir, "b", "link"));
    // Not join(): it would resolve the `..` by the text too.
    const path = `${dir}/b/link/../run.lock`;
    const all = new Child("child.ts", ["hold", path]);
    let scoped: Child | undefined;
    try {
      const acquired = await all.expect("acquired");
      assert.ok(existsSync(join(dir, "a", "run.lock")));
      const contender = new Child("child.ts", ["try", path], only(dir));
      assert.equal((await contender.expect("held")).holder, acquired.pid);
      const prober = new Child("child.ts", ["probe", path], only(dir, false));
      const probe = await prober.expect("probe");
      assert.equal(probe.state, "held");
      assert.equal(probe.holder, acquired.pid);
      all.send("release");
      await all.expect("released");

      // The other way round: the scoped holder's file is the kernel's too.
      scoped = new Child("child.ts", ["hold", path], only(dir));
      const second = await scoped.expect("acquired");
      assert.ok(existsSync(join(dir, "a", "run.lock")));
      assert.ok(!existsSync(join(dir, "b", "run.lock")));
      const other = new Child("child.ts", ["try", path]);
      assert.equal((await other.expect("held")).holder, second.pid);

      // Out of a file, `..` is ENOTDIR for the kernel, scoped or not.
      writeFileSync(join(dir, "f"), "");
      for (const flags of [["--allow-all"], only(dir, false)]) {
        const odd = new Child(
          "child.ts",
          ["probe", `${dir}/f/../run.lock`],
          flags,
        );
        const refused = await odd.expect("error");
        assert.match(
          String(refused.message),
          /not a directory/,
          flags.join(" "),
        );
      }
    } finally {
      await all.kill();
      await scoped?.kill();
      cleanup();
    }
  });

  test("a permission revoked at run time holds for every later lock and probe, with --allow-all too (ffi: Deno's own operations serve); a held lock still ends", () => {
    // Revoking ffi takes libc away: Deno's own operations serve, still
    // answering a missing file as free (Deno refuses libc's errno then).
    const expected: Record<string, Record<string, string>> = {
      write: { acquire: "LockPermissionError", inspect: "free" },
      read: { acquire: "LockPermissionError", inspect: "LockPermissionError" },
      ffi: { acquire: "ok", inspect: "free" },
    };
    for (const name of Object.keys(expected)) {
      const { dir, cleanup } = tempDir();
      try {
        const held = join(dir, "held");
        const other = join(dir, "other");
        mkdirSync(held);
        mkdirSync(other);
        const [cmd, args] = fixtureCommand(
          "revoke.ts",
          [held, other, name],
          ["--allow-all", "--no-prompt"],
        );
        const run = spawnSync(cmd, args, { encoding: "utf8", timeout: 20_000 });
        assert.equal(run.status, 0, run.stderr);
        const result = JSON.parse(run.stdout.trim());
        assert.deepEqual(result, { ...expected[name], release: "ok" }, name);
        assert.deepEqual(readdirSync(other), [], name);
        assert.deepEqual(readdirSync(held), [], name);
      } finally {
        cleanup();
      }
    }
  });
});

/**
 * Runs child.ts under a pseudo-terminal (where Deno would prompt, and hang,
 * if runlock ever called an op it has no grant for) and returns its last
 * event.
 */
function underTerminal(
  args: string[],
  flags: string[],
): Record<string, unknown> {
  const [cmd, argv] = fixtureCommand("child.ts", args, flags);
  const line = [cmd, ...argv].map((a) => `'${a}'`).join(" ");
  const result = spawnSync("script", ["-qec", line, "/dev/null"], {
    encoding: "utf8",
    timeout: 20_000,
    input: "",
  });
  assert.equal(result.error, undefined, "the child did not hang on a prompt");
  assert.doesNotMatch(result.stdout, /Deno requests/);
  return JSON.parse(result.stdout.trim().split(/\r?\n/).pop()!);
}
