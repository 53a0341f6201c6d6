package accel

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// testChildEnv makes the test binary a fake probe child (see fakeChild):
// "sleep" hangs, anything else is printed as its output.
const testChildEnv = "DROVER_ACCEL_TEST_CHILD"

func TestMain(m *testing.M) {
	switch out := os.Getenv(testChildEnv); out {
	case "":
	case "sleep":
		fmt.Println(`{"stage":"kvm_run"}`)
		time.Sleep(30 * time.Second)
		os.Exit(0)
	default:
		fmt.Println(out)
		os.Exit(0)
	}
	MaybeRunChild()
	os.Exit(m.Run())
}
