// Deno's lstat through libc (src/platform/_libc_deno.ts), against
// Deno.lstatSync on real files. A unit test beside its module: the public
// API cannot show a struct's fields (tests/platform/ffi_test.ts shows the calls).
import assert from "node:assert/strict";
import { test } from "node:test";
import { lstatLibc } from "./_libc_deno.ts";

const linux = Deno.build.os === "linux" &&
  (Deno.build.arch === "x86_64" || Deno.build.arch === "aarch64");

test(
  "lstat through libc decodes as Deno.lstatSync reads the same file: a file over 4 GiB, a directory, a symlink, a FIFO; a missing name is null, another failure its errno",
  {
    skip: !linux && "Linux x86-64 and arm64 only",
  },
  () => {
    const dir = Deno.realPathSync(Deno.makeTempDirSync({ prefix: "runlock-" }));
    try {
      const big = `${dir}/big`;
      Deno.writeTextFileSync(big, "x");
      // Sparse: st_size's high half is not zero.
      Deno.truncateSync(big, 5 * 2 ** 32 + 7);
      Deno.chmodSync(big, 0o4640);
      Deno.symlinkSync(big, `${dir}/link`);
      const fifo = new Deno.Command("mkfifo", { args: [`${dir}/fifo`] });
      assert.equal(fifo.outputSync().code, 0);
      const kinds: Record<string, string> = {
        big: "file",
        link: "symlink",
        fifo: "other",
        ".": "directory",
      };
      for (const [name, kind] of Object.entries(kinds)) {
        const path = `${dir}/${name}`;
        const theirs = Deno.lstatSync(path);
        assert.deepEqual(lstatLibc(path), {
          dev: theirs.dev,
          ino: theirs.ino,
          size: theirs.size,
          mode: theirs.mode! & 0o7777,
          uid: theirs.uid,
          kind,
        }, name);
      }
      assert.equal(lstatLibc(`${dir}/missing`), null);
      // A file where a directory should be: ENOTDIR (20), as a value.
      assert.equal(lstatLibc(`${big}/x`), 20);
      // No C string (a NUL inside): Deno's op asks.
      assert.equal(lstatLibc(`${dir}/a\0b`), undefined);
      // Longer than PATH_MAX: ENAMETOOLONG (36), as the kernel says it.
      assert.equal(lstatLibc(`${dir}/${"a".repeat(5000)}`), 36);
    } finally {
      Deno.removeSync(dir, { recursive: true });
    }
  },
);
