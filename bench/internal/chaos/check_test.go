package chaos

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAnalyseJournal(t *testing.T) {
	t0 := time.Unix(1000, 0)
	line := func(ms int, pid int, event, exec string, attempt int, detail string) string {
		return itoa(t0.Add(time.Duration(ms)*time.Millisecond).UnixNano()) + "\t" + itoa(int64(pid)) + "\t" + event + "\t" + exec + "\t" + itoa(int64(attempt)) + "\t" + detail + "\n"
	}
	path := filepath.Join(t.TempDir(), "journal")
	content := "" +
		// a: transient, then success: no repeat.
		line(0, 1, "recv", "a", 1, "async") + line(10, 1, "done", "a", 1, "transient") +
		line(700, 1, "recv", "a", 2, "async") + line(710, 1, "done", "a", 2, "succeeded") +
		// b: success, then called again 5 s later with no kill near: a repeat.
		line(20, 1, "recv", "b", 1, "async") + line(30, 1, "done", "b", 1, "succeeded") +
		line(5030, 2, "recv", "b", 2, "async") + line(5040, 2, "done", "b", 2, "succeeded") +
		// c: success right before the adapter was killed (at 2100): explained by the kill.
		line(2000, 1, "recv", "c", 1, "async") + line(2050, 1, "done", "c", 1, "succeeded") +
		line(6000, 2, "recv", "c", 2, "async") +
		// d: received, never finished (cancelled): not finished work, not a repeat after.
		line(40, 1, "recv", "d", 1, "async") + line(50, 1, "done", "d", 1, "cancelled") +
		line(900, 1, "recv", "d", 2, "async") + line(910, 1, "done", "d", 2, "permanent") +
		"garbage line\n"
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))

	journal, err := readJournal(path)
	require.NoError(t, err)
	require.Len(t, journal, 15, "the garbage line is skipped")
	a := analyseJournal(journal, []kill{{program: "dummy-adapter", at: t0.Add(2100 * time.Millisecond)}, {program: "dispatcher", at: t0.Add(40 * time.Millisecond)}})

	require.Len(t, a.repeats, 1, "%v", a.repeats)
	require.Contains(t, a.repeats[0], "execution b: attempt 2")
	require.Equal(t, 1, a.nearKill, "c's repeat is explained by the adapter's kill; the dispatcher's kill explains nothing")
	require.Equal(t, "transient", a.finished[attemptKey{"a", 1}])
	require.Equal(t, "", a.finished[attemptKey{"d", 1}], "cancelled work is not finished work")
	require.Equal(t, "", a.finished[attemptKey{"c", 2}])
	require.Equal(t, 1, a.recv[attemptKey{"c", 2}])
	require.Equal(t, 0, a.recv[attemptKey{"e", 1}])
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestParseMixAndPick(t *testing.T) {
	m, err := ParseMix("succeed=1, sleep=3")
	require.NoError(t, err)
	require.Equal(t, bSucceed, pick(m, 0.2))
	require.Equal(t, bSleep, pick(m, 0.3))
	require.Equal(t, bSleep, pick(m, 0.99))
	require.Equal(t, bFailTransient, pick(DefaultMix, 0.5))
	for _, bad := range []string{"", "succeed=0", "sucess=1", "succeed", "succeed=-1"} {
		_, err := ParseMix(bad)
		require.Error(t, err, bad)
	}
}

func TestParseSchedule(t *testing.T) {
	s, err := ParseSchedule("gateway, adapter,broker,postgres")
	require.NoError(t, err)
	require.Equal(t, []string{killFault("gateway"), killFault("dummy-adapter"), faultCloseBroker, faultKillDB}, s)
	_, err = ParseSchedule("gatway")
	require.ErrorContains(t, err, `fault "gatway"`)
	_, err = ParseSchedule(" , ")
	require.Error(t, err)
}
