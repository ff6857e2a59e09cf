package kernels

import (
	"fmt"

	"kiln/backend/cuda/cu"
)

// MoEMaxExperts is the most experts moe_route takes (MOE_MAX_E).
const MoEMaxExperts = 256

// MoE is one mixture-of-experts layer (ir.MoE) on rows of X: each row
// routed to its K experts of largest router logit, weighted by the softmax
// of their logits (Norm) or their probabilities over every expert, each a
// SwiGLU MLP of width Inter; plus, when SharedInter > 0, a shared expert
// every row goes through, scaled by sigmoid(x·SharedScale) when
// SharedScale is set. Weights are in the activation dtype; Gate, Up and
// Down are device tables of E pointers to the experts' matrices ([Inter,
// Dim], [Inter, Dim], [Dim, Inter]), SharedGate, SharedUp and SharedDown
// tables of one. Dim and the widths are multiples of 8.
type MoE struct {
	X, Out                           cu.Ptr // [rows, Dim]
	Router                           cu.Ptr // [E, Dim]
	Gate, Up, Down                   cu.Ptr
	E, K, Dim, Inter                 int
	Norm                             bool
	SharedGate, SharedUp, SharedDown cu.Ptr
	SharedScale                      cu.Ptr // [1, Dim], or 0
	SharedInter                      int
	// Tiles, when set, runs the products of steps of TileMinRows rows or
	// more on its tensor-core tiles (moe_tile.cu), where the activations
	// are f16 or bf16 and Dim and the widths multiples of 64.
	Tiles       *GEMV
	TileMinRows int
	// Widen lists the matrices kept in GGUF blocks (a table each of a kind
	// of matrix: the experts' gate, up or down, the shared expert's):
	// widened into the activation dtype where Gate, Up, Down and the
	// shared tables point, after the routing and before the products,
	// the experts no row went to skipped (their Routed tables).
	Widen []ExpertTable
}

// tiled reports whether the products of a step of rows rows run on the
// tensor-core tiles.
func (m MoE) tiled(rows int) bool {
	return m.Tiles != nil && m.TileMinRows > 0 && rows >= m.TileMinRows && m.Tiles.Act != cu.F32 &&
		m.Dim%tileBK == 0 && m.Inter%tileBK == 0 && m.SharedInter%tileBK == 0
}

// moeScratch is the layout of MoE's scratch for rows rows: byte offsets
// of its parts, each 256-aligned, and the total.
type moeScratch struct {
	topIdx, topW, sharedW, order, start, count, h, y, hs, ys, total int
}

func (m MoE) scratch(rows int, act cu.DType) moeScratch {
	var l moeScratch
	at := 0
	take := func(n int) int {
		o := at
		at += (n + 255) &^ 255
		return o
	}
	rk := rows * m.K
	l.topIdx, l.topW, l.sharedW, l.order = take(4*rk), take(4*rk), take(4*rows), take(4*rk)
	l.start, l.count = take(4*m.E), take(4*m.E)
	l.h, l.y = take(rk*m.Inter*act.Size()), take(4*rk*m.Dim)
	l.hs, l.ys = take(rows*m.SharedInter*act.Size()), take(4*rows*m.Dim)
	l.total = at
	return l
}

// ScratchBytes is the device memory MoE needs for rows rows.
func (m MoE) ScratchBytes(rows int, act cu.DType) int { return m.scratch(rows, act).total }

// Check reports what the kernels cannot take.
func (m MoE) Check() error {
	switch {
	case m.E < 1 || m.E > MoEMaxExperts || m.K < 1 || m.K > m.E:
		return fmt.Errorf("kernels: moe of %d experts, %d a row (at most %d experts)", m.E, m.K, MoEMaxExperts)
	case m.Dim%8 != 0 || m.Inter%8 != 0 || m.SharedInter%8 != 0 || m.Dim <= 0 || m.Inter <= 0 || m.SharedInter < 0:
		return fmt.Errorf("kernels: moe widths %d, %d and %d must be multiples of 8", m.Dim, m.Inter, m.SharedInter)
	case m.SharedScale != 0 && m.SharedInter == 0:
		return fmt.Errorf("kernels: moe shared expert's gate without a shared expert")
	}
	return nil
}

// MoE runs the layer on rows rows, with scratch (ScratchBytes) at scratch:
// moe_route, moe_order, moe_gate_up and moe_down (for the experts, then
// the shared expert; moe_tile_gate_up and moe_tile_down where tiled),
// moe_combine (see moe.cu and moe_tile.cu).
func (k *Kernels) MoE(s *cu.Stream, m MoE, rows int, scratch cu.Ptr) error {
	if err := m.Check(); err != nil {
		return err
	}
	if rows <= 0 {
		return fmt.Errorf("kernels: moe of %d rows", rows)
	}
	l := m.scratch(rows, k.Act)
	at := func(o int) cu.Ptr { return scratch.Add(o) }
	norm := int32(0)
	if m.Norm {
		norm = 1
	}
	sharedW := cu.Ptr(0)
	if m.SharedInter > 0 && m.SharedScale != 0 {
		sharedW = at(l.sharedW)
	}
	const block, routeBlock = 128, 512
	warps := block / 32
	if err := k.launchDep("moe_route", cu.D1(rows), cu.D1(routeBlock), 0, s, m.X, m.Router, m.SharedScale, int32(rows), int32(m.Dim),
		int32(m.E), int32(m.K), norm, at(l.topIdx), at(l.topW), sharedW); err != nil {
		return err
	}
	if err := k.launchDep("moe_order", cu.D1(m.E), cu.D1(32), 0, s, at(l.topIdx), int32(rows*m.K), at(l.order), at(l.start),
		at(l.count)); err != nil {
		return err
	}
	for _, t := range m.Widen {
		if t.Routed {
			t.Count = at(l.count)
		}
		if err := k.DequantizeExperts(s, t); err != nil {
			return err
		}
	}
	// The experts' products (experts tables of E, the lists), then the
	// shared expert's (a table of one, every row: no lists).
	gateUp, down := func(experts int, gate, up, order, start, count cu.Ptr, k32, inter int, h cu.Ptr) error {
		return k.launchDep("moe_gate_up", cu.Dim3{X: experts, Y: (inter + warps - 1) / warps, Z: 1}, cu.D1(block), 0, s,
			m.X, gate, up, order, start, count, int32(rows), int32(k32), int32(m.Dim), int32(inter), h)
	}, func(experts int, h, dn, order, start, count cu.Ptr, inter int, y cu.Ptr) error {
		return k.launchDep("moe_down", cu.Dim3{X: experts, Y: (m.Dim + warps - 1) / warps, Z: 1}, cu.D1(block), 0, s,
			h, dn, order, start, count, int32(rows), int32(inter), int32(m.Dim), y)
	}
	if m.tiled(rows) {
		z := (rows + moeTileRows - 1) / moeTileRows
		gateUp = func(experts int, gate, up, order, start, count cu.Ptr, k32, inter int, h cu.Ptr) error {
			return m.Tiles.launchMoETile(s, "moe_tile_gate_up", cu.Dim3{X: (inter + tileRows/2 - 1) / (tileRows / 2), Y: experts, Z: z},
				m.X, gate, up, order, start, count, int32(rows), int32(k32), int32(m.Dim), int32(inter), h)
		}
		down = func(experts int, h, dn, order, start, count cu.Ptr, inter int, y cu.Ptr) error {
			return m.Tiles.launchMoETile(s, "moe_tile_down", cu.Dim3{X: (m.Dim + tileRows - 1) / tileRows, Y: experts, Z: z},
				h, dn, order, start, count, int32(rows), int32(inter), int32(m.Dim), y)
		}
	}
	if err := gateUp(m.E, m.Gate, m.Up, at(l.order), at(l.start), at(l.count), m.K, m.Inter, at(l.h)); err != nil {
		return err
	}
	if err := down(m.E, at(l.h), m.Down, at(l.order), at(l.start), at(l.count), m.Inter, at(l.y)); err != nil {
		return err
	}
	ys := cu.Ptr(0)
	if m.SharedInter > 0 {
		ys = at(l.ys)
		if err := gateUp(1, m.SharedGate, m.SharedUp, 0, 0, 0, 1, m.SharedInter, at(l.hs)); err != nil {
			return err
		}
		if err := down(1, at(l.hs), m.SharedDown, 0, 0, 0, m.SharedInter, ys); err != nil {
			return err
		}
	}
	return k.launchDep("moe_combine", ewGrid(rows*m.Dim), cu.D1(256), 0, s, at(l.y), at(l.topW), ys, sharedW, int32(rows),
		int32(m.K), int32(m.Dim), m.Out)
}

// moeTileRows is the entries a tile of moe_tile.cu takes (MT_ROWS), and
// moeTileShared the dynamic shared memory of its kernels (gemv_tile.cu's
// tiles of 8 n8 tiles).
const moeTileRows = 64

var moeTileShared = gemvCfg{tile: true, nt: 8, bk: tileBK, stages: tileStages, pf: tilePF}.shared()

// launchMoETile launches moe_tile.cu's kernel name on grid.
func (g *GEMV) launchMoETile(s *cu.Stream, name string, grid cu.Dim3, args ...any) error {
	g.mu.Lock()
	f := g.moeFns[name]
	g.mu.Unlock()
	if f == nil {
		m, err := g.parts.holding(name)
		if err == nil {
			f, err = m.Function(name)
		}
		if err == nil {
			err = f.SetMaxDynamicShared(moeTileShared)
		}
		if err != nil {
			return fmt.Errorf("kernels: %s: %w", name, err)
		}
		g.mu.Lock()
		if g.moeFns == nil {
			g.moeFns = map[string]*cu.Function{}
		}
		g.moeFns[name] = f
		g.mu.Unlock()
	}
	launch := f.Launch
	if g.PDL {
		launch = f.LaunchDependent
	}
	if err := launch(grid, cu.D1(tileThreads), moeTileShared, s, args...); err != nil {
		return fmt.Errorf("kernels: %s: %w", name, err)
	}
	return nil
}
