package cuda

// PoisonExpertScratch makes b fill the scratch of the experts kept in GGUF
// blocks with NaN before each mixture layer, for the tests of the external
// package: a step that read an expert it did not widen gives NaN.
func PoisonExpertScratch(b *Backend) { b.poisonExpertScratch = true }
