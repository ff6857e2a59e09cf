package cuda

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"sync"

	"kiln/backend/cuda/cu"
	"kiln/backend/cuda/kernels"
	"kiln/ir"
	"kiln/tensor"
)

// weightDTypes decides the device dtype of every weight and constant: the
// compute dtype for matrices read by products and embedding lookups, the
// product's output dtype for the biases of MatMulBias (cuBLASLt's epilogue
// takes them so), f32 for the rest (norm weights, other biases, RoPE
// tables); a mixture of experts' matrices in act (with blocks and experts,
// those in GGUF blocks stay so: moe.go widens them a step at a time). With fp8, an FP8 (E4M3) matrix that only products read stays
// E4M3 (fp8Product), with its scales beside it; with blocks, a GGUF matrix
// of a format kernels.Dequantize takes that only products read stays in its
// blocks (devBlocks). A tensor read both ways (a tied embedding) is
// widened to act.
func weightDTypes(g *ir.Graph, act cu.DType, fp8, blocks, experts bool) map[*ir.Node]cu.DType {
	want := map[*ir.Node]cu.DType{}
	output := map[*ir.Value]bool{} // the logits and what they come from, in f32
	if chain, err := logitsChain(g); err == nil {
		for _, v := range chain {
			output[v] = true
		}
	}
	for _, n := range g.Nodes {
		for i, in := range n.Inputs {
			if in.Def.Op != ir.Weight && in.Def.Op != ir.Const {
				continue
			}
			dt := cu.F32
			product := n.Op == ir.MatMul || n.Op == ir.MatMulBias
			moe := n.Op == ir.MoE && i >= 1 // the router, the experts' matrices and the shared expert's gate
			if (product && i == 1) || (n.Op == ir.Embed && i == 0) || (n.Op == ir.MatMulBias && i == 2 && !output[n.Out()]) || moe {
				dt = act
			}
			if product && i == 1 && fp8 && staysFP8(in.Def.Attrs.Tensor, output[n.Out()]) {
				dt = cu.F8E4M3
			}
			if (product && i == 1 || experts && moeMatrix(n, i)) && blocks && staysInBlocks(in.Def.Attrs.Tensor) {
				dt = devBlocks
			}
			if old, ok := want[in.Def]; ok && old != dt {
				kept := func(d cu.DType) bool { return d == act || d == cu.F8E4M3 || d == devBlocks }
				if kept(old) && kept(dt) {
					dt = act // a matrix that is also an embedding table
				} else {
					dt = cu.F32 // read two ways: keep full precision (not produced by the builders)
				}
			}
			want[in.Def] = dt
		}
	}
	return want
}

// moeMatrix reports whether input i of node n is an expert's matrix of a
// mixture (ir.MoE): the experts' gate, up and down, the shared expert's
// (not the router, nor the shared expert's gate vector).
func moeMatrix(n *ir.Node, i int) bool {
	if n.Op != ir.MoE {
		return false
	}
	e := n.Attrs.Experts
	return i >= 2 && i < 2+3*e+3*b2i(n.Attrs.Shared)
}

// uploadWeights copies every weight and constant the graph reads to the
// device, converting on the host into two pinned buffers in turn so that
// reading the file (page faults of the mapping) and converting the next
// chunk overlap the transfer of the previous one. It returns the bytes
// it copied.
func (l *loaded) uploadWeights(progress io.Writer) (int64, error) {
	want := weightDTypes(l.compiled.Graph, l.act, l.fp8, !l.b.WidenBlocks, l.b.ExpertBlocks)
	type key struct {
		t  *tensor.Tensor
		dt cu.DType
	}
	var total int64
	seen := map[key]bool{}
	for n, dt := range want {
		k := key{n.Attrs.Tensor, dt}
		if !seen[k] {
			seen[k] = true
			total += deviceBytes(n.Attrs.Tensor, dt)
		}
	}
	u, err := newUploader(l, total, progress)
	if err != nil {
		return 0, err
	}
	defer u.close()
	l.weights = map[*ir.Node]deviceTensor{}
	copies := map[key]deviceTensor{}
	// In graph order, so the progress follows the model's layers.
	for _, n := range l.compiled.Graph.Nodes {
		dt, ok := want[n]
		if !ok {
			continue
		}
		t := n.Attrs.Tensor
		k := key{t, dt}
		dev, ok := copies[k]
		if !ok {
			if dev, err = l.uploadWeight(u, t, dt); err != nil {
				return u.done, fmt.Errorf("cuda: weight %s: %w", n.Attrs.Name, err)
			}
			copies[k] = dev
		}
		l.weights[n] = dev
	}
	if err := u.finish(); err != nil {
		return u.done, err
	}
	// The device holds the weights now: the file's pages behind them go
	// back to the system (read from the file again if anything touches
	// them).
	for k := range copies {
		release(k.t)
	}
	return u.done, nil
}

// release gives back the file pages behind t (and its parts).
func release(t *tensor.Tensor) {
	if t.Release != nil {
		t.Release()
	}
	for _, p := range t.Parts {
		release(p)
	}
}

// uploadWeight copies tensor t to the device as dt (E4M3 matrices with
// their scales).
func (l *loaded) uploadWeight(u *uploader, t *tensor.Tensor, dt cu.DType) (deviceTensor, error) {
	dev := deviceTensor{dtype: dt}
	if len(t.Shape) > 0 {
		dev.rows = t.Shape[0]
	}
	var err error
	if dev.p, err = l.alloc(int(deviceBytes(t, dt))); err != nil {
		return dev, err
	}
	if dt == devBlocks {
		dev.blocks = t.DType
		l.b.stats.BlockMatrices++
		return dev, u.putParts(dev.p, t, dt, u.putRaw)
	}
	if err := u.putParts(dev.p, t, dt, func(dst cu.Ptr, t *tensor.Tensor) error { return u.put(dst, t, dt) }); err != nil {
		return dev, err
	}
	if dt == cu.F8E4M3 {
		if dev.scales, err = l.uploadScales(t); err != nil {
			return dev, err
		}
		dev.perTensor = len(t.Scales) <= 1
		l.b.stats.FP8Matrices++
	}
	return dev, nil
}

const uploadChunk = 32 << 20 // bytes of one pinned buffer

type uploader struct {
	l        *loaded
	bufs     [2]*cu.HostBuf
	events   [2]*cu.Event
	cur      int
	f32      []float32 // conversion scratch
	done     int64
	total    int64
	progress io.Writer
	shown    int // last percentage printed
}

func newUploader(l *loaded, total int64, progress io.Writer) (*uploader, error) {
	u := &uploader{l: l, total: total, progress: progress, shown: -1}
	for i := range u.bufs {
		b, err := l.dev.AllocHost(uploadChunk)
		if err != nil {
			u.close()
			return nil, err
		}
		u.bufs[i] = b
		e, err := l.dev.NewEvent(false)
		if err != nil {
			u.close()
			return nil, err
		}
		u.events[i] = e
	}
	return u, nil
}

func (u *uploader) close() {
	u.l.stream.Sync()
	for i := range u.bufs {
		if u.bufs[i] != nil {
			u.bufs[i].Free()
		}
		if u.events[i] != nil {
			u.events[i].Close()
		}
	}
}

// putParts uploads t with put, or a tensor of Parts (a stacked matrix the
// graph compiler left unjoined: Backend.StacksLazily) part after part,
// each to its rows' place: no host copy of the stack is made.
func (u *uploader) putParts(dst cu.Ptr, t *tensor.Tensor, dt cu.DType, put func(cu.Ptr, *tensor.Tensor) error) error {
	if len(t.Parts) == 0 {
		return put(dst, t)
	}
	for _, p := range t.Parts {
		if err := u.putParts(dst, p, dt, put); err != nil {
			return err
		}
		dst = dst.Add(int(deviceBytes(p, dt)))
	}
	return nil
}

// put uploads tensor t to dst, converted to dt.
func (u *uploader) put(dst cu.Ptr, t *tensor.Tensor, dt cu.DType) error {
	n := int(t.Shape.Elements())
	size := dt.Size()
	chunk := uploadChunk / 4 // elements: the f32 scratch bounds it
	if bs := t.DType.BlockSize(); bs > 1 {
		chunk -= chunk % bs
	}
	for off := 0; off < n; off += chunk {
		m := min(chunk, n-off)
		if err := u.send(dst.Add(off*size), m*size, func(out []byte) error { return u.convert(t, off, m, dt, out) }); err != nil {
			return err
		}
	}
	return nil
}

// putRaw uploads tensor t's bytes as they are stored (GGUF blocks).
func (u *uploader) putRaw(dst cu.Ptr, t *tensor.Tensor) error {
	n := int(deviceBytes(t, devBlocks))
	if n > len(t.Data) {
		return fmt.Errorf("tensor %s: %d bytes, need %d", t.Name, len(t.Data), n)
	}
	for off := 0; off < n; off += uploadChunk {
		m := min(uploadChunk, n-off)
		if err := u.send(dst.Add(off), m, func(out []byte) error { copyParallel(out, t.Data[off:off+m]); return nil }); err != nil {
			return err
		}
	}
	return nil
}

// send fills the next pinned buffer's first m bytes (fill) and queues
// their copy to dst. The buffer is free once the copy queued from it two
// chunks ago is done.
func (u *uploader) send(dst cu.Ptr, m int, fill func(out []byte) error) error {
	if err := u.events[u.cur].Sync(); err != nil {
		return err
	}
	if err := fill(u.bufs[u.cur].Bytes()[:m]); err != nil {
		return err
	}
	if err := u.l.dev.CopyHtoDAsync(dst, u.bufs[u.cur], 0, m, u.l.stream); err != nil {
		return err
	}
	if err := u.events[u.cur].Record(u.l.stream); err != nil {
		return err
	}
	u.cur ^= 1
	u.done += int64(m)
	u.show()
	return nil
}

func (u *uploader) show() {
	if u.progress == nil || u.total == 0 {
		return
	}
	pct := int(100 * u.done / u.total)
	if pct == u.shown {
		return
	}
	u.shown = pct
	fmt.Fprintf(u.progress, "\rloading weights to %s: %.2f / %.2f GB (%d%%)", u.l.dev.Name, float64(u.done)/1e9, float64(u.total)/1e9, pct)
}

func (u *uploader) finish() error {
	err := u.l.stream.Sync()
	if u.progress != nil && u.total > 0 {
		fmt.Fprintln(u.progress)
	}
	return err
}

// convert writes elements [off, off+m) of t, as dt, into out.
func (u *uploader) convert(t *tensor.Tensor, off, m int, dt cu.DType, out []byte) error {
	from, err := t.DType.Bytes(int64(off))
	if err != nil {
		return err
	}
	need, err := t.DType.Bytes(int64(m))
	if err != nil {
		return err
	}
	if from+need > int64(len(t.Data)) {
		return fmt.Errorf("tensor %s: %d bytes, need %d", t.Name, len(t.Data), from+need)
	}
	src := t.Data[from : from+need]
	if same(t.DType, dt) {
		copyParallel(out, src)
		return nil
	}
	if cap(u.f32) < m {
		u.f32 = make([]float32, m)
	}
	f := u.f32[:m]
	// Decode and encode in parallel slices; block-quantized sources split on
	// block boundaries.
	parts := runtime.NumCPU()
	step := (m + parts - 1) / parts
	if bs := t.DType.BlockSize(); bs > 1 {
		step = (step + bs - 1) / bs * bs
	}
	var wg sync.WaitGroup
	errs := make([]error, parts)
	for p := 0; p < parts; p++ {
		lo, hi := p*step, min((p+1)*step, m)
		if lo >= hi {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, _ := t.DType.Bytes(int64(lo))
			b, _ := t.DType.Bytes(int64(hi))
			if err := tensor.ToF32(t.DType, src[a:b], f[lo:hi]); err != nil {
				errs[p] = err
				return
			}
			scaleRows(t, off+lo, f[lo:hi])
			encode(f[lo:hi], dt, out[lo*dt.Size():hi*dt.Size()])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("tensor %s: %w", t.Name, err)
		}
	}
	return nil
}

// copyParallel copies src into dst (as copy) on every CPU at once. src is
// most often a slice of the model file's mapping, whose pages come in on
// first touch: one thread faulting them in read about 1.2–1.4 GB/s on the
// GPU machines (15 GB of weights in 10.6–13.6 s, H100 and H200), far
// below what the host link takes.
func copyParallel(dst, src []byte) {
	n := min(len(dst), len(src))
	parts := min(runtime.NumCPU(), n/copyPart)
	if parts <= 1 {
		copy(dst, src)
		return
	}
	step := (n + parts - 1) / parts
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += step {
		hi := min(lo+step, n)
		wg.Go(func() { copy(dst[lo:hi], src[lo:hi]) })
	}
	wg.Wait()
}

// copyPart is the least copyParallel gives a thread.
const copyPart = 1 << 20

// devBlocks is the device dtype of a matrix kept in its GGUF blocks
// (deviceTensor.blocks says which format).
const devBlocks cu.DType = -1

// staysInBlocks reports whether GGUF matrix t can stay in its blocks for
// the products that read it: a format kernels.Dequantize takes.
func staysInBlocks(t *tensor.Tensor) bool {
	return len(t.Shape) == 2 && slices.Contains(kernels.DequantFormats, t.DType)
}

// deviceBytes is the size of t on the device as dt.
func deviceBytes(t *tensor.Tensor, dt cu.DType) int64 {
	if dt == devBlocks {
		n, _ := t.DType.Bytes(t.Shape.Elements())
		return n
	}
	return t.Shape.Elements() * int64(dt.Size())
}

// staysFP8 reports whether FP8 matrix t can stay E4M3 on the device for
// the products that read it (fp8Product): not the graph's output (the
// logits are f32, which cuBLASLt's FP8 products do not write), K a
// multiple of 16 and N even (what they take).
func staysFP8(t *tensor.Tensor, output bool) bool {
	return t.DType == tensor.F8_E4M3 && !output && len(t.Shape) == 2 && t.Shape[1]%16 == 0 && t.Shape[0]%2 == 0
}

// uploadScales copies the scales of FP8 matrix t to the device, one
// float32 a row (a per-tensor scale repeated): RunF8 reads a row's; a
// per-tensor product reads the first as cuBLASLt's scale of the weights.
func (l *loaded) uploadScales(t *tensor.Tensor) (cu.Ptr, error) {
	n := t.Shape[0]
	f := make([]float32, n)
	for r := range f {
		f[r] = t.RowScale(r)
	}
	p, err := l.alloc(4 * n)
	if err != nil {
		return 0, err
	}
	return p, l.dev.Upload(p, cu.AsBytes(f))
}

// scaleRows applies an FP8 matrix's scales (tensor.Tensor.Scales) to f,
// its decoded elements from element first on; other tensors are left as
// they are.
func scaleRows(t *tensor.Tensor, first int, f []float32) {
	if len(t.Scales) == 0 || len(t.Shape) != 2 || t.Shape[1] == 0 {
		return
	}
	k := t.Shape[1]
	for i := range f {
		f[i] *= t.RowScale((first + i) / k)
	}
}

// same reports whether tensor dtype s is stored exactly as device dtype d.
func same(s tensor.DType, d cu.DType) bool {
	return (s == tensor.F32 && d == cu.F32) || (s == tensor.F16 && d == cu.F16) || (s == tensor.BF16 && d == cu.BF16) ||
		(s == tensor.F8_E4M3 && d == cu.F8E4M3)
}

func encode(f []float32, dt cu.DType, out []byte) {
	switch dt {
	case cu.F32:
		for i, v := range f {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		}
	case cu.F16:
		for i, v := range f {
			binary.LittleEndian.PutUint16(out[2*i:], tensor.F32ToF16(v))
		}
	case cu.BF16:
		for i, v := range f {
			binary.LittleEndian.PutUint16(out[2*i:], tensor.F32ToBF16(v))
		}
	}
}
