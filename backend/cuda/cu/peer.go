package cu

// EnablePeerAccess lets kernels on d read and write memory allocated on
// peer (one process, unified addressing: a pointer of peer's is used as it
// is). It reports false, and enables nothing, when the driver says d cannot
// reach peer's memory (no NVLink or PCIe peer path).
func (d *Device) EnablePeerAccess(peer *Device) (bool, error) {
	ok, err := drvCanAccessPeer(d.dev, peer.dev)
	if err != nil || !ok {
		return false, err
	}
	return true, d.Do(func() error { return drvEnablePeerAccess(peer.ctx) })
}
