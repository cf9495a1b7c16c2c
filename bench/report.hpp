// Rendering the bench's results: text tables, JSON (documented keys), progress on a terminal.
#pragma once

#include "compare.hpp"
#include "replay.hpp"
#include "tune.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace streampool::bench {

// The keys of one replay: those of docs/bench.md's table ("JSON"), which lists each with its
// meaning.
nlohmann::json replay_json(const ReplayReport& report);
// {title, header, rows}: the label columns as strings, figures as numbers, "n/a" as null (a
// figure cell that is no number stays a string).
nlohmann::json table_json(const Table& table);
// Text for stdout: two-space indents; bytes that are not UTF-8 (a trace's file name) replaced.
std::string json_text(const nlohmann::json& json);

// One row per report, failed allocations among the columns.
Table replay_table(const std::vector<ReplayReport>& reports);
// One row per kind of device call of each report that counted them (ReplayOptions::count_calls),
// in the seam's order; the time in them only for timed replays.
Table device_calls_table(const std::vector<ReplayReport>& reports);
// The baseline's row first (rank "baseline"), then the best `top` rows (the baseline marked where
// it ranks); each row's keys that differ from the baseline's, "(baseline)" for the baseline.
Table tune_table(const std::vector<TuneRow>& rows, std::size_t top);
// The keys of a row's options that differ from the baseline's, "key=value,...".
std::string tune_changes(const std::vector<TuneRow>& rows, const TuneRow& row);
const TuneRow& tune_baseline(const std::vector<TuneRow>& rows);


// A progress callback drawing a bar on stderr when stderr is a terminal; a no-op otherwise.
std::function<void(double)> progress_bar(const std::string& label);

std::string human_bytes(std::uint64_t bytes);

// Writes `content` to `path`, making its folder; std::runtime_error "cannot write PATH" where any
// of it fails.
void write_file(const std::filesystem::path& path, const std::string& content);

}  // namespace streampool::bench
