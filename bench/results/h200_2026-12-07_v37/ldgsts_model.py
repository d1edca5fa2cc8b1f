# A model of the fp8 attention's cp.async (LDGSTS) copies, to compare with Nsight Compute's counts
# (PERF v0.37). A copy instruction: 32 lanes x 16 bytes, lane -> (row = pc >> 3, piece = pc & 7),
# pc = lane + 32 i; destination st + row * 128 + (piece ^ swizzle) * 16 (keys: swizzle 4 (row & 1),
# values: row & 6), source row * 128 + piece * 16 (the layout by head). Stage offsets mod 128 of
# the shipped kernel (4 stages, 4 warps, 4144-byte stages after 2080 bytes of static shared memory).
# Model: a wavefront is a quarter warp's lanes that fall in one 128-byte line of shared memory;
# each wavefront asks the L2 for the `gran`-byte pieces of global memory its lanes touch.
def instr(o, i, kind, gran):
    wf = {}
    for lane in range(32):
        pc = lane + 32 * i
        row, col = pc >> 3, pc & 7
        swz = 4 * (row & 1) if kind == "k" else row & 6
        d = o + row * 128 + (col ^ swz) * 16
        s = row * 128 + col * 16
        wf.setdefault((lane // 8, d // 128), set()).add(s // gran)
    return len(wf), sum(len(v) for v in wf.values()) * (gran // 32)

for label, offs in [("shipped (4144-byte stages)", [32, 80, 0, 48, 96, 16, 64, 112] * 2), ("aligned (pending patch)", [0] * 16)]:
    for gran in (32, 64):
        w = s = n = 0
        for o in offs:
            for kind in "kv":
                for i in range(4):
                    a, b = instr(o, i, kind, gran)
                    w, s, n = w + a, s + b, n + 1
        print(f"{label}, {gran}-byte requests: {w / n:.2f} wavefronts and {s / n:.2f} sectors a data instruction")
