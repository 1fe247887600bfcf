// Aligned plain-text tables for the CLI's human-readable output.
//
// Columns are left-aligned, separated by two spaces, with no trailing whitespace; widths count
// UTF-8 code points. Cells go through Printable (client/printable.h): a cell cannot move the
// cursor, break its row or reach the terminal as a control sequence. Not thread-safe: build and
// print a Table from one thread.
#ifndef DATTN_CLIENT_TABLE_H_
#define DATTN_CLIENT_TABLE_H_

#include <ostream>
#include <string>
#include <vector>

namespace dattn {
namespace client {

class Table {
 public:
  explicit Table(std::vector<std::string> headers);

  // A row with fewer cells than headers is padded with empty cells; extra cells are dropped.
  void AddRow(std::vector<std::string> cells);

  bool empty() const { return rows_.empty(); }
  size_t size() const { return rows_.size(); }

  // Prints the header row and every row, each ending in '\n'.
  void Print(std::ostream& out) const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

// Display width of `text`: its number of UTF-8 code points.
size_t DisplayWidth(const std::string& text);

}  // namespace client
}  // namespace dattn

#endif  // DATTN_CLIENT_TABLE_H_
