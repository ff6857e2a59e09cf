//go:build !cgo || !linux

package cu

import (
	"errors"
	"unsafe"
)

// Without cgo (or off Linux) nothing can be loaded: Available reports why,
// and these are never reached.

const cgoEnabled = false

var errNoCgo = errors.New("cuda unavailable: kiln was built without cgo")

func loadLib(int, Library) (string, error)                            { return "", errNoCgo }
func cMalloc(int) unsafe.Pointer                                      { return nil }
func cFree(unsafe.Pointer)                                            {}
func drvInit() error                                                  { return errNoCgo }
func drvVersion() (int, error)                                        { return 0, errNoCgo }
func drvDeviceCount() (int, error)                                    { return 0, errNoCgo }
func drvDeviceGet(int) (int, error)                                   { return 0, errNoCgo }
func drvDeviceName(int) (string, error)                               { return "", errNoCgo }
func drvDeviceAttr(int, int) (int, error)                             { return 0, errNoCgo }
func drvTotalMem(int) (uint64, error)                                 { return 0, errNoCgo }
func drvPrimaryCtxRetain(int) (unsafe.Pointer, error)                 { return nil, errNoCgo }
func drvPrimaryCtxRelease(int) error                                  { return errNoCgo }
func drvCtxSetCurrent(unsafe.Pointer) error                           { return errNoCgo }
func drvCtxSync() error                                               { return errNoCgo }
func drvCanAccessPeer(int, int) (bool, error)                         { return false, errNoCgo }
func drvEnablePeerAccess(unsafe.Pointer) error                        { return errNoCgo }
func drvMemInfo() (uint64, uint64, error)                             { return 0, 0, errNoCgo }
func drvMemAlloc(int) (Ptr, error)                                    { return 0, errNoCgo }
func drvMemFree(Ptr) error                                            { return errNoCgo }
func drvHostAlloc(int) (unsafe.Pointer, error)                        { return nil, errNoCgo }
func drvHostFree(unsafe.Pointer) error                                { return errNoCgo }
func drvHtoD(Ptr, unsafe.Pointer, int, unsafe.Pointer) error          { return errNoCgo }
func drvDtoH(unsafe.Pointer, Ptr, int, unsafe.Pointer) error          { return errNoCgo }
func drvDtoD(Ptr, Ptr, int, unsafe.Pointer) error                     { return errNoCgo }
func drvMemset8(Ptr, byte, int, unsafe.Pointer) error                 { return errNoCgo }
func drvMemset32(Ptr, uint32, int, unsafe.Pointer) error              { return errNoCgo }
func drvStreamCreate() (unsafe.Pointer, error)                        { return nil, errNoCgo }
func drvStreamDestroy(unsafe.Pointer) error                           { return errNoCgo }
func drvStreamSync(unsafe.Pointer) error                              { return errNoCgo }
func drvStreamWaitEvent(unsafe.Pointer, unsafe.Pointer) error         { return errNoCgo }
func drvEventCreate(bool) (unsafe.Pointer, error)                     { return nil, errNoCgo }
func drvEventDestroy(unsafe.Pointer) error                            { return errNoCgo }
func drvEventRecord(unsafe.Pointer, unsafe.Pointer) error             { return errNoCgo }
func drvEventSync(unsafe.Pointer) error                               { return errNoCgo }
func drvEventElapsed(unsafe.Pointer, unsafe.Pointer) (float32, error) { return 0, errNoCgo }
func drvModuleLoad([]byte) (unsafe.Pointer, error)                    { return nil, errNoCgo }
func drvModuleUnload(unsafe.Pointer) error                            { return errNoCgo }
func drvModuleFunction(unsafe.Pointer, string) (unsafe.Pointer, error) {
	return nil, errNoCgo
}
func drvModuleGlobal(unsafe.Pointer, string) (Ptr, int, error)   { return 0, 0, errNoCgo }
func drvFuncSetAttr(unsafe.Pointer, string, int, int) error      { return errNoCgo }
func drvFuncGetAttr(unsafe.Pointer, string, int) (int, error)    { return 0, errNoCgo }
func drvOccupancy(unsafe.Pointer, string, int, int) (int, error) { return 0, errNoCgo }
func drvLaunch(unsafe.Pointer, string, Dim3, Dim3, int, unsafe.Pointer, unsafe.Pointer) error {
	return errNoCgo
}
func drvHasLaunchEx() bool { return false }
func drvLaunchEx(unsafe.Pointer, string, Dim3, Dim3, int, unsafe.Pointer, unsafe.Pointer, bool, int) error {
	return errNoCgo
}
func drvStreamBeginCapture(unsafe.Pointer, int) error            { return errNoCgo }
func drvStreamEndCapture(unsafe.Pointer) (unsafe.Pointer, error) { return nil, errNoCgo }
func drvStreamIsCapturing(unsafe.Pointer) (int, error)           { return 0, errNoCgo }
func drvGraphInstantiate(unsafe.Pointer) (unsafe.Pointer, error) { return nil, errNoCgo }
func drvGraphLaunch(unsafe.Pointer, unsafe.Pointer) error        { return errNoCgo }
func drvGraphExecDestroy(unsafe.Pointer) error                   { return errNoCgo }
func drvGraphDestroy(unsafe.Pointer) error                       { return errNoCgo }
func nvrtcVersionGet() (int, int, error)                         { return 0, 0, errNoCgo }
func nvrtcArchs() ([]int, error)                                 { return nil, errNoCgo }
func nvrtcCompile(string, string, []string, bool) ([]byte, bool, string, error) {
	return nil, false, "", errNoCgo
}
func ltVersion() int                                                  { return 0 }
func ltCreate() (unsafe.Pointer, error)                               { return nil, errNoCgo }
func ltDestroy(unsafe.Pointer) error                                  { return errNoCgo }
func ltPlanFree(unsafe.Pointer)                                       {}
func ltPlanCreate(unsafe.Pointer, ltPlanArgs) (unsafe.Pointer, error) { return nil, errNoCgo }
func ltAlgos(unsafe.Pointer) int                                      { return 0 }
func ltAlgoConfig(unsafe.Pointer, int) AlgoConfig                     { return AlgoConfig{} }
func ltRun(unsafe.Pointer, unsafe.Pointer, int, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, Ptr, float32, float32, Ptr, int, unsafe.Pointer) error {
	return errNoCgo
}

func gettid() int { return 0 }

func tryOpen(string) error { return errNoCgo }

func ncclVersion() (int, error)                                              { return 0, errNoCgo }
func ncclInitAll([]int) ([]unsafe.Pointer, error)                            { return nil, errNoCgo }
func ncclDestroy(unsafe.Pointer) error                                       { return errNoCgo }
func ncclAbort(unsafe.Pointer) error                                         { return errNoCgo }
func ncclAsyncError(unsafe.Pointer) error                                    { return errNoCgo }
func ncclAllReduce(Ptr, Ptr, int, int, unsafe.Pointer, unsafe.Pointer) error { return errNoCgo }
func ncclAllGather(Ptr, Ptr, int, int, unsafe.Pointer, unsafe.Pointer) error { return errNoCgo }

func drvTensorMapEncodeTiled(*TensorMap, int, TiledMap, []uint32, int) error { return errNoCgo }
